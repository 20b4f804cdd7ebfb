// LowcommBackend::reconfigure: torch 2.15's membership change on one process group
// (backend.h says what it does; docs/torch.md, "Membership change").

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <unordered_set>
#include <variant>
#include <vector>

#include "backend.h"
#include "work.h"

#ifdef C10D_BACKEND_HAS_RECONFIGURE

namespace lowcomm::torch_backend {
namespace {

// The members in rank order: a list as given, a set sorted (the same order on every member).
std::vector<std::string> ranked_handles(const c10d::ReconfigureOptions& opts) {
  if (const auto* list = std::get_if<std::vector<c10d::ReconfigureHandle>>(&opts.handles))
    return *list;
  const auto& set = std::get<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles);
  std::vector<std::string> out(set.begin(), set.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

c10d::ReconfigureHandle LowcommBackend::get_reconfigure_handle() const {
  std::lock_guard<std::mutex> lock(handle_mu_);
  if (!handle_) {
    auto made = lowcomm::create_unique_id();
    TORCH_CHECK(made.is_ok(), "lowcomm: get_reconfigure_handle: ", made.status().to_string());
    handle_ = *made;
  }
  return handle_->to_string();
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::reconfigure(const c10d::ReconfigureOptions& opts) {
  const std::vector<std::string> handles = ranked_handles(opts);
  TORCH_CHECK_VALUE(!handles.empty(), "lowcomm: reconfigure needs at least one handle");
  TORCH_CHECK_VALUE(uuids_.count(opts.uuid) == 0, "lowcomm: reconfigure: uuid ", opts.uuid,
                    " was used before on this group; pass a fresh one every time");
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(handle_mu_);
    TORCH_CHECK_VALUE(handle_.has_value(),
                      "lowcomm: reconfigure: this process never asked for its handle "
                      "(dist._get_reconfigure_handle) so it cannot be among the members");
    mine = handle_->to_string();
  }
  {
    std::vector<std::string> sorted = handles;
    std::sort(sorted.begin(), sorted.end());
    auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    TORCH_CHECK_VALUE(twice == sorted.end(), "lowcomm: reconfigure: a handle is given twice (",
                      twice == sorted.end() ? "" : twice->substr(0, twice->find('/')), ")");
  }
  auto at = std::find(handles.begin(), handles.end(), mine);
  TORCH_CHECK_VALUE(at != handles.end(), "lowcomm: reconfigure: this process's current handle (",
                    mine.substr(0, mine.find('/')),
                    ") is not among the handles; a handle that served as the root is spent: "
                    "ask dist._get_reconfigure_handle again before each reconfigure");
  const int new_rank = static_cast<int>(at - handles.begin());
  const int new_size = static_cast<int>(handles.size());
  auto root = lowcomm::UniqueId::parse(handles.front());
  TORCH_CHECK_VALUE(root.is_ok(),
                    "lowcomm: reconfigure: the first handle: ", root.status().to_string());
  uuids_.insert(opts.uuid);

  // The old communicator goes first (its peers may be dead; abort, no goodbye), keeping what
  // error feedback it can still give.
  std::optional<std::vector<uint8_t>> residuals;
  if (comm_) {
    if (comm_->status().is_ok()) {
      auto saved = comm_->save_error_feedback();
      if (saved.is_ok()) residuals = std::move(saved).value();
    }
    comm_->abort();
    comm_.reset();
  }
  awaiting_members_ = true;
  if (new_rank == 0) {
    std::lock_guard<std::mutex> lock(handle_mu_);
    handle_.reset();  // init takes the listening socket: the next handle is a new one
  }

  lowcomm::CommOptions o = comm_options();
  o.init_timeout = opts.timeout.value_or(timeout_);
  const lowcomm::UniqueId id =
      lowcomm::derive_unique_id(*root, "torch reconfigure uuid " + std::to_string(opts.uuid));
  auto comm = lowcomm::Communicator::init(id, new_rank, new_size, o);
  if (!comm)
    C10_THROW_ERROR(DistBackendError, "lowcomm: reconfigure (uuid " + std::to_string(opts.uuid) +
                                          ") as rank " + std::to_string(new_rank) + " of " +
                                          std::to_string(new_size) + ": " +
                                          comm.status().to_string());
  comm_ = std::move(comm).value();
  if (residuals) (void)comm_->restore_error_feedback(residuals->data(), residuals->size());
  rank_ = new_rank;
  size_ = new_size;
  seq_ = 0;
  awaiting_members_ = false;
  auto w =
      c10::make_intrusive<LowcommWork>(c10d::OpType::UNKNOWN, rank_, std::vector<at::Tensor>{});
  w->start({});
  return w;
}

}  // namespace lowcomm::torch_backend

#endif  // C10D_BACKEND_HAS_RECONFIGURE
