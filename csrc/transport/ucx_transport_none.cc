// UcxTransport in a build without UCX (LOWCOMM_UCX=OFF or no libucx-dev): create() says so, and the
// communicator keeps every peer on TCP.

#include "transport/ucx_transport.h"

namespace lowcomm::transport {

struct UcxTransport::Impl {};

bool UcxTransport::built_with_ucx() {
  return false;
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxTransport::~UcxTransport() = default;

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(int /*rank*/) {
  return unsupported("this lowcomm was built without UCX (configure with libucx-dev installed)");
}

// Unreachable: no UcxTransport exists in this build.
const std::string& UcxTransport::address() const {
  static const std::string none;
  return none;
}
Status UcxTransport::connect(int, const std::string&, bool) {
  return unsupported("built without UCX");
}
Request UcxTransport::isend(int, uint64_t, const void*, uint64_t) {
  auto s = std::make_shared<RequestState>();
  s->complete(unsupported("built without UCX"));
  return Request(s);
}
Request UcxTransport::irecv(int, uint64_t, void*, uint64_t) {
  auto s = std::make_shared<RequestState>();
  s->complete(unsupported("built without UCX"));
  return Request(s);
}
void UcxTransport::abort(const Status&) {}
void UcxTransport::wait_released() {}
uint64_t UcxTransport::closed_with_sends_pending() const {
  return 0;
}

}  // namespace lowcomm::transport
