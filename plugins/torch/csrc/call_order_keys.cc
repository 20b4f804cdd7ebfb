#include "call_order_keys.h"

#include <c10/util/Exception.h>

namespace lowcomm::torch_backend {

bool CallOrderKeys::consistent(size_t p, size_t upto) const {
  for (size_t j = p; j <= upto; ++j) {
    if (history_[j] != history_[j - p]) return false;
  }
  return true;
}

size_t CallOrderKeys::period() const {
  std::lock_guard<std::mutex> lock(mu_);
  return period_;
}

void CallOrderKeys::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  history_.clear();
  calls_ = 0;
  period_ = 0;
  lost_ = false;
}

std::string CallOrderKeys::next(const std::string& signature) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lost_) return "";
  const size_t i = calls_++;
  if (i < kMaxHistory) {
    history_.push_back(signature);
    if (period_ != 0 && history_[i] != history_[i - period_]) {
      // The calls broke the period: the next longer one that explains all of them, if any.
      size_t p = period_ + 1;
      while (p <= i && !consistent(p, i)) ++p;
      period_ = p <= i ? p : 0;
    } else if (period_ == 0 && i > 0 && consistent(i, i)) {
      period_ = i;  // the first call's signature again: a step of i calls, until shown wrong
    }
  } else if (period_ == 0 || history_[i % period_] != signature) {
    lost_ = true;
    TORCH_WARN(
        "lowcomm: error feedback by call order stops: the compressed all-reduces of the "
        "last ",
        kMaxHistory, " calls do not repeat in a fixed order");
    return "";
  }
  const size_t slot = period_ != 0 ? i % period_ : i;
  return "ef/order/" + std::to_string(slot) + "/" + signature;
}

}  // namespace lowcomm::torch_backend
