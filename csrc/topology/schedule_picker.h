#pragma once
// Flat or two levels, from what the two took. Sizes alone cannot say: where the sites' WAN links
// are fast, or the ranks of a site share few cores, the local phases of two levels cost more
// than the WAN saves (docs/sites.md, "Paths between sites and a published matrix": flat wins
// there). So for an all-reduce that may take either (AllReduceOptions::Schedule::kAuto, sites that
// allow two levels, sites.h's threshold met), the communicator tries both in each size class
// (powers of two of bytes) and then keeps the faster, trying the other again every kReexplore calls
// of the class, in case the links changed.
//
// Every rank must pick the same: the times are the slowest rank's (each rank sends the time of
// its previous flat or two-level all-reduce in the next one's descriptor, op_report.h), fed to
// record() after the operation that carried them, and pick() runs on the executor in operation
// order, so every rank holds the same numbers at the same point.

#include <cstdint>
#include <map>

#include "topology/schedule.h"

namespace lowcomm::topology {

class SchedulePicker {
 public:
  static constexpr uint64_t kReexplore = 32;

  // The size class of an all-reduce of `bytes`; a sparse codec's calls have classes of their
  // own, by K's power of two too (their choice is between gather-all, kOneHop, and the owner
  // reduction, kDefault).
  static int size_class(uint64_t bytes, bool sparse = false, uint32_t keep = 0);
  // The power of two of bytes a class stands for.
  static int bytes_class(int size_class) { return size_class % kSparseClasses; }
  static bool sparse_class(int size_class) { return size_class >= kSparseClasses; }
  // The schedule for the next auto call of this class: kTwoLevel (a sparse class: kOneHop) or
  // kDefault.
  Algorithm pick(int size_class);
  // The slowest rank's time of a call of this class that ran `algorithm`.
  void record(int size_class, Algorithm algorithm, double seconds);

  struct Times {
    double flat = 0;  // kDefault; 0: not measured yet
    double two = 0;   // the other: kTwoLevel, or kOneHop in a sparse class
    uint64_t picks = 0;
  };
  Times times(int size_class) const;
  // The schedule the class prefers now (no pick counted): what the log reports.
  Algorithm pick_would(int size_class) const;

 private:
  // A sparse call's class: kSparseClasses · (1 + bit_width(K)) + its bytes' class.
  static constexpr int kSparseClasses = 64;
  static Algorithm other(int size_class) {
    return sparse_class(size_class) ? Algorithm::kOneHop : Algorithm::kTwoLevel;
  }
  std::map<int, Times> classes_;
};

}  // namespace lowcomm::topology
