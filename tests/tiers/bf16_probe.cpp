// Per-tier test source (the avx512bf16 tier, real and emulated): simd16_bf16.h's operations
// behind a Bf16Probe table (bf16_probe.h).
#include "tests/tiers/bf16_probe.h"

#include "backends/cpu/simd16_bf16.h"

namespace attnops::cpu::ATTNOPS_TIER_NS {
namespace {

void dot_pairs(const float* acc, const std::uint16_t* a, const std::uint16_t* b, float* out) {
  simd::store(out, simd::dot_pairs(simd::load(acc), simd::bf32_load(a), simd::bf32_load(b)));
}
void store_pairs(const float* p0, const float* p1, std::uint16_t* out) {
  simd::store_pairs(out, simd::load(p0), simd::load(p1));
}
void interleave_rows(const std::uint16_t* r0, const std::uint16_t* r1, int w, std::uint16_t* out) {
  simd::interleave_rows(r0, r1, w, out);
}
void exp2_p(const float* t, float* out) {
  simd::store(out, simd::exp2_p(simd::load(t)));
}

}  // namespace

const Bf16Probe& bf16_probe() {
#if defined(ATTNOPS_ISA_EMULATE)
  constexpr bool kEmulated = true;
#else
  constexpr bool kEmulated = false;
#endif
  static constexpr Bf16Probe kProbe{kEmulated, &dot_pairs, &store_pairs, &interleave_rows, &exp2_p};
  return kProbe;
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
