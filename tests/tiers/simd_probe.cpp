// Per-tier test source: exports this tier's vector primitives (simd16.h, vanilla_simd.h) through
// a SimdProbe table, so that one test binary checks every tier's bodies.
#include "tests/tiers/simd_probe.h"

#include "backends/cpu/simd16.h"
#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu::ATTNOPS_TIER_NS {
namespace {

using vanilla::i64;

void exp_rows(const float* in, float* out, i64 n) {
  for (i64 j = 0; j < n; j += 16) {
    const int w = vanilla::lanes_left(n - j);
    simd::store_n(out + j, simd::exp(simd::load_n(in + j, w)), w);
  }
}
void tanh_rows(const float* in, float* out, i64 n) {
  for (i64 j = 0; j < n; j += 16) {
    const int w = vanilla::lanes_left(n - j);
    simd::store_n(out + j, simd::tanh(simd::load_n(in + j, w)), w);
  }
}
float exp_shift_sum(float* s, i64 n, float m) {
  return vanilla::exp_shift_sum(s, n, m);
}
void dot_key(DType dt, const float* Q, i64 ldq, i64 R, const void* k, i64 D, float* s, i64 lds) {
  switch (dt) {
    case DType::f16:
      return vanilla::dot_key<DType::f16>(Q, ldq, R, k, D, s, lds);
    case DType::bf16:
      return vanilla::dot_key<DType::bf16>(Q, ldq, R, k, D, s, lds);
    default:
      return vanilla::dot_key<DType::f32>(Q, ldq, R, k, D, s, lds);
  }
}
void pv_block(DType dt, const float* P, i64 ldp, i64 R, const void* V, i64 ldv, i64 n, i64 Dv, float* acc,
              i64 ldacc) {
  switch (dt) {
    case DType::f16:
      return vanilla::pv_block<DType::f16>(P, ldp, R, V, ldv, n, Dv, acc, ldacc);
    case DType::bf16:
      return vanilla::pv_block<DType::bf16>(P, ldp, R, V, ldv, n, Dv, acc, ldacc);
    default:
      return vanilla::pv_block<DType::f32>(P, ldp, R, V, ldv, n, Dv, acc, ldacc);
  }
}
void convert_row(const void* src, DType t, i64 n, float* dst, float mul) {
  simd::convert_row(src, t, n, dst, mul);
}
void masks(const float* a, const float* b, float* selected, std::uint32_t* eq_bits, std::uint32_t* lt_bits) {
  const simd::V16 va = simd::load(a), vb = simd::load(b);
  const simd::Mask16 lt = simd::lt(va, vb);
  simd::store(selected, simd::select(lt, va, vb));
  *eq_bits = simd::eq(va, vb);
  *lt_bits = lt;
}
void gather(const float* base, std::int32_t stride, std::uint32_t m, float* out) {
  simd::store(out, simd::gather(base, stride, static_cast<simd::Mask16>(m)));
}

}  // namespace

const SimdProbe& simd_probe() {
  static constexpr SimdProbe kProbe{static_cast<Isa>(ATTNOPS_TIER_LEVEL),
                                    &exp_rows,
                                    &tanh_rows,
                                    &exp_shift_sum,
                                    &dot_key,
                                    &pv_block,
                                    &convert_row,
                                    &masks,
                                    &gather};
  return kProbe;
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
