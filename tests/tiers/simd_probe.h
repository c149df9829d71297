// The vector primitives of one CPU tier, exported for tests/tiers/test_simd16.cpp:
// simd_probe.cpp is compiled once per tier (like the kernels) and fills this table.
#pragma once

#include <cstdint>

#include "attnops/dtype.h"
#include "backends/cpu/isa.h"

namespace attnops::cpu {

struct SimdProbe {
  Isa isa;
  // out[i] = simd::exp(in[i]) / simd::tanh(in[i]) for i < n (16 at a time, partial tail)
  void (*exp)(const float* in, float* out, std::int64_t n);
  void (*tanh)(const float* in, float* out, std::int64_t n);
  // vanilla_simd.h
  float (*exp_shift_sum)(float* s, std::int64_t n, float m);
  void (*dot_key)(DType dt, const float* Q, std::int64_t ldq, std::int64_t R, const void* k, std::int64_t D,
                  float* s, std::int64_t lds);
  void (*pv_block)(DType dt, const float* P, std::int64_t ldp, std::int64_t R, const void* V,
                   std::int64_t ldv, std::int64_t n, std::int64_t Dv, float* acc, std::int64_t ldacc);
  void (*convert_row)(const void* src, DType t, std::int64_t n, float* dst, float mul);
  // Lane masks: for 16 lanes of a and b, writes select(lt(a, b), a, b) and eq(a, b) as bits, and
  // gathers base[l * stride] for the lanes of m.
  void (*masks)(const float* a, const float* b, float* selected, std::uint32_t* eq_bits,
                std::uint32_t* lt_bits);
  void (*gather)(const float* base, std::int32_t stride, std::uint32_t m, float* out);
};

#define ATTNOPS_DECLARE_PROBE(ns) \
  namespace ns {                  \
  const SimdProbe& simd_probe();  \
  }
ATTNOPS_DECLARE_PROBE(tier_baseline)
ATTNOPS_DECLARE_PROBE(tier_avx2)
ATTNOPS_DECLARE_PROBE(tier_avx512)
ATTNOPS_DECLARE_PROBE(tier_avx512bf16)
ATTNOPS_DECLARE_PROBE(tier_amx)
#undef ATTNOPS_DECLARE_PROBE

}  // namespace attnops::cpu
