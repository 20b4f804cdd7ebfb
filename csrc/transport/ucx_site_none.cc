// UcxSite in a build without UCX (LOWCOMM_UCX=OFF or no libucx-dev): create() says so, and the
// communicator keeps every peer on TCP.

#include "transport/ucx_site.h"

namespace lowcomm::transport {

struct UcxSite::Impl {};

bool UcxSite::built_with_ucx() {
  return false;
}

UcxSite::UcxSite(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxSite::~UcxSite() = default;

Result<std::unique_ptr<UcxSite>> UcxSite::create(int /*rank*/) {
  return unsupported("this lowcomm was built without UCX (configure with libucx-dev installed)");
}

// Unreachable: no UcxSite exists in this build.
const std::string& UcxSite::address() const {
  static const std::string none;
  return none;
}
Status UcxSite::connect(int, const std::string&, bool) {
  return unsupported("built without UCX");
}
Request UcxSite::isend(int, uint64_t, const void*, uint64_t) {
  auto s = std::make_shared<RequestState>();
  s->complete(unsupported("built without UCX"));
  return Request(s);
}
Request UcxSite::irecv(int, uint64_t, void*, uint64_t) {
  auto s = std::make_shared<RequestState>();
  s->complete(unsupported("built without UCX"));
  return Request(s);
}
void UcxSite::abort(const Status&) {}

}  // namespace lowcomm::transport
