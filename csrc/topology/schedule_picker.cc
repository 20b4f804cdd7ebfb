#include "topology/schedule_picker.h"

#include <bit>

namespace lowcomm::topology {

int SchedulePicker::size_class(uint64_t bytes, bool sparse, uint32_t keep) {
  const int size = bytes == 0 ? 0 : static_cast<int>(std::bit_width(bytes)) - 1;
  return sparse ? kSparseClasses * (1 + static_cast<int>(std::bit_width(keep))) + size : size;
}

Algorithm SchedulePicker::pick(int size_class) {
  Times& t = classes_[size_class];
  ++t.picks;
  // Two levels (sparse: gather-all) first, then flat (the owner reduction), until each has a
  // time; the times arrive two calls late, so each is tried twice at most.
  const Algorithm alt = other(size_class);
  if (t.two == 0) return alt;
  if (t.flat == 0) return Algorithm::kDefault;
  const Algorithm best = t.two <= t.flat ? alt : Algorithm::kDefault;
  const Algorithm second = best == alt ? Algorithm::kDefault : alt;
  return t.picks % kReexplore == 0 ? second : best;
}

SchedulePicker::Times SchedulePicker::times(int size_class) const {
  auto it = classes_.find(size_class);
  return it == classes_.end() ? Times{} : it->second;
}

Algorithm SchedulePicker::pick_would(int size_class) const {
  const Times t = times(size_class);
  const Algorithm alt = other(size_class);
  if (t.two == 0 || t.flat == 0) return alt;
  return t.two <= t.flat ? alt : Algorithm::kDefault;
}

void SchedulePicker::record(int size_class, Algorithm algorithm, double seconds) {
  if (!(seconds > 0)) return;
  Times& t = classes_[size_class];
  (algorithm == other(size_class) ? t.two : t.flat) = seconds;
}

}  // namespace lowcomm::topology
