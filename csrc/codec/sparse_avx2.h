#pragma once
// AVX2 helpers of the sparse codecs (sparse_avx2.cc, compiled with -mavx2): the per-chunk
// passes that touch every element. sparse_cpu.cc calls them only where cpu::avx2_supported();
// each computes exactly what its scalar statement in sparse_cpu.cc computes.

#include <cstdint>

namespace lowcomm::cpu::sparse_avx2 {

// y[i] = x[i] (+ r[i] when r is set); key[i] = the selection key (magnitude_key(y[i]) when
// topk, else randk_key(salt, i)); returns the largest magnitude_key(y[i]).
uint32_t load_fp32(const float* x, const float* r, uint32_t len, float* y, uint32_t* key, bool topk,
                   uint32_t salt);
// key[i] = randk_key(salt, i).
void randk_keys(uint32_t salt, uint32_t len, uint32_t* key);
// out[j] = #{i : key[i] >= t[j]} for four thresholds, each at most 0x7FFFFFFF.
void count_ge4(const uint32_t* key, uint32_t len, const uint32_t t[4], uint32_t out[4]);
// Appends to cand the keys in [lo, hi) (hi <= 0x80000000); returns how many. Writes up to 8
// entries past the last one: cand holds len + 8.
uint32_t collect(const uint32_t* key, uint32_t len, uint32_t lo, uint64_t hi, uint32_t* cand);
// The kept offsets in increasing order: key > t, then key == t while ties last; returns how many.
uint32_t select(const uint32_t* key, uint32_t len, uint32_t t, uint32_t ties, uint32_t* sel);
// r[i] = decay * y[i] (y finite).
void scale(float* r, const float* y, uint32_t len, float decay);

}  // namespace lowcomm::cpu::sparse_avx2
