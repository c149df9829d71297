// The bf16 pair operations of backends/cpu/simd16_bf16.h, exported per build for
// tests/tiers/test_bf16_ops.cpp: bf16_probe.cpp is compiled for the avx512bf16 tier (the real
// instructions, where the build has that tier) and for its emulated build (the avx2 flags,
// ATTNOPS_ISA_EMULATE), so that the emulation is checked against the instruction definitions
// everywhere and against the hardware where the CPU has AVX-512 BF16.
#pragma once

#include <cstdint>

namespace attnops::cpu {

struct Bf16Probe {
  bool emulated;
  // out[l] = dot_pairs(acc, a, b)[l] for 16 lanes; a and b hold 32 bf16 each.
  void (*dot_pairs)(const float* acc, const std::uint16_t* a, const std::uint16_t* b, float* out);
  // out[2l] = bf16(p0[l]), out[2l + 1] = bf16(p1[l]) for 16 lanes.
  void (*store_pairs)(const float* p0, const float* p1, std::uint16_t* out);
  // out[2e] = r0[e], out[2e + 1] = r1 ? r1[e] : 0 for e < w (<= 32); nothing else written.
  void (*interleave_rows)(const std::uint16_t* r0, const std::uint16_t* r1, int w, std::uint16_t* out);
  // out[l] = exp2_p(t)[l] for 16 lanes.
  void (*exp2_p)(const float* t, float* out);
};

namespace tier_avx512bf16 {
const Bf16Probe& bf16_probe();
}
namespace tier_avx512bf16_emulated {
const Bf16Probe& bf16_probe();
}

}  // namespace attnops::cpu
