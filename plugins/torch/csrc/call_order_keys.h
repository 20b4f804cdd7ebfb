#pragma once
// Error-feedback keys from the order of calls, for trainers that all-reduce a fresh tensor per
// parameter every step (`param.grad = before - after; dist.all_reduce(param.grad)`): the
// address of such a tensor says nothing (the allocator hands the same block to another
// parameter), but the k-th compressed call of every step is the same parameter.
//
// The step is found from the calls themselves: the sequence of call signatures (dtype and
// shape) is taken to repeat with the smallest period consistent with everything seen so far,
// counted from the first compressed call. Call i uses key (i mod period); before a period is
// known, key i, which is what (i mod period) will be for the first step's calls. A call that
// breaks the period makes the next consistent one the period (at worst none yet); the key
// carries the signature, so a residual is only ever applied to a tensor of its shape.

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace lowcomm::torch_backend {

class CallOrderKeys {
 public:
  // History kept to find the period; beyond it a confirmed period is still checked, and a
  // call that breaks it gets no key (no error feedback) and a warning.
  static constexpr size_t kMaxHistory = 1 << 16;

  // The key of the next compressed call with this signature; "" when none can be given.
  std::string next(const std::string& signature);
  size_t period() const;
  // Forgets every call: the next compressed call is the first again (its residuals dropped).
  void reset();

 private:
  bool consistent(size_t p, size_t upto) const;

  mutable std::mutex mu_;
  std::vector<std::string> history_;
  size_t calls_ = 0;
  size_t period_ = 0;  // 0: none known yet
  bool lost_ = false;  // history full and the period broken: no more keys
};

}  // namespace lowcomm::torch_backend
