#include "collectives/schedule_picker.h"

#include <bit>

namespace lowcomm::collectives {

int SchedulePicker::size_class(uint64_t bytes) {
  return bytes == 0 ? 0 : static_cast<int>(std::bit_width(bytes)) - 1;
}

Algorithm SchedulePicker::pick(int size_class) {
  Times& t = classes_[size_class];
  ++t.picks;
  // Two levels first (what the sizes suggest), then flat, until each has a time; the times
  // arrive two calls late, so each is tried twice at most.
  if (t.two == 0) return Algorithm::kTwoLevel;
  if (t.flat == 0) return Algorithm::kDefault;
  const Algorithm best = t.two <= t.flat ? Algorithm::kTwoLevel : Algorithm::kDefault;
  const Algorithm other = best == Algorithm::kTwoLevel ? Algorithm::kDefault : Algorithm::kTwoLevel;
  return t.picks % kReexplore == 0 ? other : best;
}

SchedulePicker::Times SchedulePicker::times(int size_class) const {
  auto it = classes_.find(size_class);
  return it == classes_.end() ? Times{} : it->second;
}

Algorithm SchedulePicker::pick_would(int size_class) const {
  const Times t = times(size_class);
  if (t.two == 0 || t.flat == 0) return Algorithm::kTwoLevel;
  return t.two <= t.flat ? Algorithm::kTwoLevel : Algorithm::kDefault;
}

void SchedulePicker::record(int size_class, Algorithm algorithm, double seconds) {
  if (!(seconds > 0)) return;
  Times& t = classes_[size_class];
  (algorithm == Algorithm::kTwoLevel ? t.two : t.flat) = seconds;
}

}  // namespace lowcomm::collectives
