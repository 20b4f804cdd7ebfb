// ElasticCommunicator: the public face of ElasticImpl (membership/elastic_impl.h).
#include "lowcomm/elastic.h"

#include "membership/elastic_impl.h"

namespace lowcomm {

ElasticCommunicator::ElasticCommunicator(std::unique_ptr<ElasticImpl> impl)
    : impl_(std::move(impl)) {}
ElasticCommunicator::~ElasticCommunicator() = default;

Result<std::unique_ptr<ElasticCommunicator>> ElasticCommunicator::init(
    const UniqueId& id, int rank, int nranks, const ElasticOptions& options) {
  auto impl = ElasticImpl::found(id, rank, nranks, options);
  if (!impl) return impl.status();
  return std::unique_ptr<ElasticCommunicator>(new ElasticCommunicator(std::move(impl).value()));
}

Result<std::unique_ptr<ElasticCommunicator>> ElasticCommunicator::join(
    const UniqueId& id, const std::vector<std::string>& seeds, const ElasticOptions& options) {
  auto impl = ElasticImpl::join(id, seeds, options);
  if (!impl) return impl.status();
  return std::unique_ptr<ElasticCommunicator>(new ElasticCommunicator(std::move(impl).value()));
}

uint32_t ElasticCommunicator::member_id() const {
  return impl_->member_id();
}
std::string ElasticCommunicator::member_address() const {
  return impl_->member_address();
}
ElasticView ElasticCommunicator::view() const {
  return impl_->view();
}
int ElasticCommunicator::rank() const {
  return impl_->rank();
}
int ElasticCommunicator::size() const {
  return static_cast<int>(impl_->view().members.size());
}
ElasticStats ElasticCommunicator::stats() const {
  return impl_->stats();
}
Status ElasticCommunicator::status() const {
  return impl_->status();
}
ElasticState ElasticCommunicator::state() const {
  return impl_->state();
}

Status ElasticCommunicator::all_reduce(const void* send, void* recv, uint64_t count, DType dtype,
                                       ReduceOp op, const AllReduceOptions& options) {
  return impl_->all_reduce(send, recv, count, dtype, op, options);
}

Status ElasticCommunicator::broadcast(const void* send, void* recv, uint64_t count, DType dtype,
                                      uint32_t root) {
  return impl_->broadcast(send, recv, count, dtype, root);
}

Status ElasticCommunicator::all_gather(const void* send, void* recv, uint64_t send_count,
                                       DType dtype, ElasticView* layout) {
  return impl_->all_gather(send, recv, send_count, dtype, layout);
}

Result<std::vector<uint8_t>> ElasticCommunicator::error_feedback_state() const {
  return impl_->error_feedback_state();
}

Status ElasticCommunicator::register_state(const std::string& name, void* data, uint64_t bytes) {
  return impl_->register_state(name, data, bytes);
}

}  // namespace lowcomm
