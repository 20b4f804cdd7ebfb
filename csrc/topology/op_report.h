#pragma once
// What each rank tells the others in the descriptor of every flat or two-level all-reduce,
// beside the operation itself: its measured link rate (shares.h) and how long its previous such
// all-reduce took (schedule_picker.h). 32 bits in the low half of the descriptor's tag
// (descriptor.h: the one per-sender field, not compared): the rate's code in the high 16, the
// time's in the low 16, each a log scale so that 16 bits span every value that occurs:
//   rate: 1 + round(1024 log2(bytes/s / kMinRate)), 0 unknown: 0.07% steps from 80 kbit/s
//   time: 1 + round(2048 log2(microseconds)), 0 unknown: 0.03% steps from 1 us to 71 minutes

#include <cstdint>

namespace lowcomm::topology {

inline constexpr double kMinRate = 1e4;   // bytes/s (80 kbit/s): slower is not believed
inline constexpr double kMaxRate = 4e12;  // bytes/s (32 Tbit/s): faster is not believed

uint16_t encode_rate(double bytes_per_second);  // 0 outside [kMinRate, kMaxRate] or NaN
double decode_rate(uint16_t code);              // 0 for 0
uint16_t encode_time(double seconds);           // 0 for NaN or below 0
double decode_time(uint16_t code);              // 0 for 0

struct OpReport {
  uint16_t rate = 0;
  uint16_t time = 0;
  uint32_t pack() const { return static_cast<uint32_t>(rate) << 16 | time; }
  static OpReport unpack(uint32_t v) {
    return {static_cast<uint16_t>(v >> 16), static_cast<uint16_t>(v & 0xffff)};
  }
};

}  // namespace lowcomm::topology
