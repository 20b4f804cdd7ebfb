// What the group compresses and under which error-feedback names: the group options' codec
// for all-reduces (group_compresses, group_allreduce_options: keyed by address or call order),
// lowcomm.torch.all_reduce's per-call codec and name (allreduce_with), and the residuals kept
// under those names (listed, dropped, saved and restored through the communicator).

#include <c10/util/Exception.h>

#include <sstream>

#include "backend.h"
#include "work.h"

namespace lowcomm::torch_backend {

bool LowcommBackend::group_compresses(const at::Tensor& b, lowcomm::ReduceOp op) const {
  // The core's one policy (lowcomm::decide_compression), with the group's codec and threshold.
  const lowcomm::CompressionPolicy policy{codec_, static_cast<uint64_t>(config_.codec_threshold)};
  return lowcomm::decide_compression(policy, std::nullopt, to_dtype(b.scalar_type()), op,
                                     b.nbytes(), "", false)
      .codec.has_value();
}

lowcomm::AllReduceOptions LowcommBackend::group_allreduce_options(const at::Tensor& t,
                                                                  lowcomm::ReduceOp op) {
  lowcomm::AllReduceOptions ar;
  if (!group_compresses(t, op)) return ar;
  ar.codec = codec_;
  if (config_.error_feedback == BackendConfig::ErrorFeedback::kAddress) {
    // One residual per gradient buffer: the same parameter's gradient lives at the same
    // address with the same shape every step. The user's tensor names it, never the staged
    // copy of a non-contiguous one (a new buffer every call, whose address the next call's
    // copy of another tensor may get): its first element's address (storage plus offset), its
    // shape, and for a non-contiguous view its strides too (views of one storage that start
    // at one address with one shape differ there).
    std::ostringstream key;
    key << "ef/" << t.data_ptr() << "/" << t.sizes();
    if (!t.is_contiguous()) key << "/" << t.strides();
    ar.error_feedback_key = key.str();
  } else if (config_.error_feedback == BackendConfig::ErrorFeedback::kCallOrder) {
    std::ostringstream sig;
    sig << t.scalar_type() << t.sizes();
    ar.error_feedback_key = order_keys_.next(sig.str());
  }
  return ar;
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::allreduce_with(at::Tensor& tensor,
                                                              const std::string& codec,
                                                              const std::string& error_feedback_key,
                                                              c10d::ReduceOp op, int64_t step,
                                                              bool owner_ef) {
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "all_reduce", {tensor});
  auto staged = std::make_shared<Staged>(tensor, dev);
  const at::Tensor& b = staged->buf;
  lowcomm::AllReduceOptions ar;
  dev.apply(ar);
  if (!codec.empty()) {
    auto spec = lowcomm::parse_codec_spec(codec);
    TORCH_CHECK(spec.is_ok(), "lowcomm: codec '", codec, "': ", spec.status().to_string());
    ar.codec = *spec;
    ar.error_feedback_key = error_feedback_key;
    ar.owner_error_feedback = owner_ef && !error_feedback_key.empty();
  }
  if (step >= 0) ar.step = static_cast<uint64_t>(step);
  std::vector<lowcomm::Work> works{comm()->all_reduce(b.data_ptr(), b.data_ptr(), elems(b),
                                                      to_dtype(b.scalar_type()), to_op(op), ar)};
  return launch(dev, c10d::OpType::ALLREDUCE, {tensor}, std::move(works),
                [staged] { staged->write_back(); });
}

std::vector<uint8_t> LowcommBackend::save_error_feedback() {
  auto r = comm()->save_error_feedback();
  TORCH_CHECK(r.is_ok(), "lowcomm: ", r.status().to_string());
  return *r;
}

void LowcommBackend::restore_error_feedback(const std::vector<uint8_t>& bytes) {
  lowcomm::Status s = comm()->restore_error_feedback(bytes.data(), bytes.size());
  TORCH_CHECK(s.is_ok(), "lowcomm: ", s.to_string());
}

std::vector<std::string> LowcommBackend::error_feedback_keys() {
  auto r = comm()->error_feedback_keys();
  TORCH_CHECK(r.is_ok(), "lowcomm: ", r.status().to_string());
  return *r;
}

size_t LowcommBackend::reset_error_feedback(const std::string& name) {
  auto r = comm()->reset_error_feedback(name);
  TORCH_CHECK(r.is_ok(), "lowcomm: ", r.status().to_string());
  // The call-order keys ("ef/order/<slot>/...") start over when all of them were dropped.
  const std::string order = "ef/order";
  if (name.empty() || name == order || order.compare(0, name.size() + 1, name + "/") == 0)
    order_keys_.reset();
  return *r;
}

}  // namespace lowcomm::torch_backend
