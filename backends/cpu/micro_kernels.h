// Register-blocked fp32 micro-kernels on V16 (per-tier header; see simd16.h): the one set of
// micro-kernels of the CPU backend, shared by the tiled forward (tiled_cpu.cpp), vanilla's
// products (vanilla_cpu.cpp) and the backward (tiled_backward.cpp).
//
// Both keep R x NC accumulators in registers (R broadcast rows, NC vectors of 16 lanes; at most
// 6 x 4 = 24 vectors) and stream the other operand:
//   gemm_micro   c[r][16n + l] (=|+=) sum_k a[r * lda + k] * b[k * ldb + 16n + l]
//   scaled_acc   c[r][16n + l] = s[16n + l] * c[r][16n + l] + sum_k a[k * lda + r] * b[k * ldb + 16n + l]
//                (s == nullptr: c starts from 0 instead; kAccumulate: c += ..., s unused;
//                kSkipZeros: lanes whose b is 0 are not
//                updated, so a NaN / inf in `a` cannot reach them through 0 x inf; the non-finite
//                policy's guarded run, backends/common/softmax_policy.h)
// (scaled_acc reads `a` transposed: the tiled kernel's O^T = alpha * O^T + V^T P^T with V rows;
// with kARows it reads a[r * lda + k] instead: V^T rows, the AVX2 forward's, tiled_cpu.cpp.)
//
// The callers' tile shapes (up to kMaxR x kMaxNC) are split into register tiles of at most
// kRegR x kRegNC that fit the tier's vector registers without spilling: 6 x 4 zmm accumulators
// of 32 on AVX-512, 6 x 1 (= 12 ymm of 16) on AVX2, 2 x 1 (= 8 xmm of 16) on the baseline.
// Each register tile streams the whole reduced axis; the split only re-reads the operands
// from L1.
#pragma once

#include <array>
#include <cstdint>

#include "backends/cpu/simd16.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::micro {

using simd::V16;

inline constexpr int kMaxR = 6;   // broadcast rows per micro-tile
inline constexpr int kMaxNC = 4;  // vectors of 16 lanes per micro-tile
#if ATTNOPS_SIMD_LEVEL >= 2
inline constexpr int kRegR = 6, kRegNC = 4;
#elif ATTNOPS_SIMD_LEVEL == 1
inline constexpr int kRegR = 6, kRegNC = 1;
#else
inline constexpr int kRegR = 2, kRegNC = 1;
#endif

template <int R, int NC, bool kAccumulate>
void gemm_micro(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t K, float* c,
                std::int64_t ldc) {
  if constexpr (NC > kRegNC) {
    gemm_micro<R, kRegNC, kAccumulate>(a, lda, b, ldb, K, c, ldc);
    gemm_micro<R, NC - kRegNC, kAccumulate>(a, lda, b + 16 * kRegNC, ldb, K, c + 16 * kRegNC, ldc);
    return;
  } else if constexpr (R > kRegR) {
    gemm_micro<kRegR, NC, kAccumulate>(a, lda, b, ldb, K, c, ldc);
    gemm_micro<R - kRegR, NC, kAccumulate>(a + kRegR * lda, lda, b, ldb, K, c + kRegR * ldc, ldc);
    return;
  }
  V16 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) acc[r][n] = kAccumulate ? simd::load(c + r * ldc + 16 * n) : simd::zero();
  for (std::int64_t k = 0; k < K; ++k) {
    V16 bv[NC];
    for (int n = 0; n < NC; ++n) bv[n] = simd::load(b + k * ldb + 16 * n);
    for (int r = 0; r < R; ++r) {
      const V16 ab = simd::set1(a[r * lda + k]);
      for (int n = 0; n < NC; ++n) acc[r][n] = simd::fma(ab, bv[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) simd::store(c + r * ldc + 16 * n, acc[r][n]);
}

template <int R, int NC, bool kSkipZeros = false, bool kAccumulate = false, bool kARows = false>
void scaled_acc(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t K,
                const float* s, float* c, std::int64_t ldc) {
  if constexpr (NC > kRegNC) {
    scaled_acc<R, kRegNC, kSkipZeros, kAccumulate, kARows>(a, lda, b, ldb, K, s, c, ldc);
    scaled_acc<R, NC - kRegNC, kSkipZeros, kAccumulate, kARows>(
        a, lda, b + 16 * kRegNC, ldb, K, s ? s + 16 * kRegNC : s, c + 16 * kRegNC, ldc);
    return;
  } else if constexpr (R > kRegR) {
    scaled_acc<kRegR, NC, kSkipZeros, kAccumulate, kARows>(a, lda, b, ldb, K, s, c, ldc);
    scaled_acc<R - kRegR, NC, kSkipZeros, kAccumulate, kARows>(kARows ? a + kRegR * lda : a + kRegR, lda, b,
                                                               ldb, K, s, c + kRegR * ldc, ldc);
    return;
  }
  V16 acc[R][NC];
  for (int n = 0; n < NC; ++n) {
    if constexpr (kAccumulate) {
      for (int r = 0; r < R; ++r) acc[r][n] = simd::load(c + r * ldc + 16 * n);
      continue;
    }
    if (!s) {
      for (int r = 0; r < R; ++r) acc[r][n] = simd::zero();
      continue;
    }
    const V16 sv = simd::load(s + 16 * n);
    for (int r = 0; r < R; ++r) acc[r][n] = simd::mul(simd::load(c + r * ldc + 16 * n), sv);
  }
  for (std::int64_t k = 0; k < K; ++k) {
    V16 bv[NC];
    for (int n = 0; n < NC; ++n) bv[n] = simd::load(b + k * ldb + 16 * n);
    // a's element (r, k): V[k][r] (rows of V) or V^T[r][k] (kARows).
    const float* ak = kARows ? a + k : a + k * lda;
    const std::int64_t ar = kARows ? lda : 1;
    if constexpr (kSkipZeros) {
      simd::Mask16 nz[NC];
      for (int n = 0; n < NC; ++n) nz[n] = simd::nonzero(bv[n]);
      for (int r = 0; r < R; ++r) {
        const V16 ab = simd::set1(ak[r * ar]);
        for (int n = 0; n < NC; ++n) acc[r][n] = simd::fma_masked(nz[n], ab, bv[n], acc[r][n]);
      }
    } else {
      for (int r = 0; r < R; ++r) {
        const V16 ab = simd::set1(ak[r * ar]);
        for (int n = 0; n < NC; ++n) acc[r][n] = simd::fma(ab, bv[n], acc[r][n]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) simd::store(c + r * ldc + 16 * n, acc[r][n]);
}

// Tables indexed [R - 1][NC - 1]: the edges of a tile use the smaller shapes, so no size is padded.
template <bool kAccumulate>
using GemmFn = void (*)(const float*, std::int64_t, const float*, std::int64_t, std::int64_t, float*,
                        std::int64_t);
using ScaledAccFn = void (*)(const float*, std::int64_t, const float*, std::int64_t, std::int64_t,
                             const float*, float*, std::int64_t);

template <int R, bool kAccumulate>
constexpr std::array<GemmFn<kAccumulate>, kMaxNC> gemm_row() {
  return {gemm_micro<R, 1, kAccumulate>, gemm_micro<R, 2, kAccumulate>, gemm_micro<R, 3, kAccumulate>,
          gemm_micro<R, 4, kAccumulate>};
}
template <int R, bool kSkipZeros, bool kAccumulate, bool kARows>
constexpr std::array<ScaledAccFn, kMaxNC> scaled_row() {
  return {
      scaled_acc<R, 1, kSkipZeros, kAccumulate, kARows>, scaled_acc<R, 2, kSkipZeros, kAccumulate, kARows>,
      scaled_acc<R, 3, kSkipZeros, kAccumulate, kARows>, scaled_acc<R, 4, kSkipZeros, kAccumulate, kARows>};
}
template <bool kAccumulate>
inline constexpr std::array<std::array<GemmFn<kAccumulate>, kMaxNC>, kMaxR> kGemm = {
    gemm_row<1, kAccumulate>(), gemm_row<2, kAccumulate>(), gemm_row<3, kAccumulate>(),
    gemm_row<4, kAccumulate>(), gemm_row<5, kAccumulate>(), gemm_row<6, kAccumulate>()};
template <bool kSkipZeros, bool kAccumulate, bool kARows = false>
inline constexpr std::array<std::array<ScaledAccFn, kMaxNC>, kMaxR> kScaledAccT = {
    scaled_row<1, kSkipZeros, kAccumulate, kARows>(), scaled_row<2, kSkipZeros, kAccumulate, kARows>(),
    scaled_row<3, kSkipZeros, kAccumulate, kARows>(), scaled_row<4, kSkipZeros, kAccumulate, kARows>(),
    scaled_row<5, kSkipZeros, kAccumulate, kARows>(), scaled_row<6, kSkipZeros, kAccumulate, kARows>()};
inline constexpr const auto& kScaledAcc = kScaledAccT<false, false>;
inline constexpr const auto& kScaledAccSkipZeros = kScaledAccT<true, false>;
inline constexpr const auto& kAccumulateT = kScaledAccT<false, true>;
// The same from V^T rows (a[r * lda + k]).
inline constexpr const auto& kScaledAccRows = kScaledAccT<false, false, true>;
inline constexpr const auto& kScaledAccRowsSkipZeros = kScaledAccT<true, false, true>;

// c[e][16n + l] += sum_{k < K} a[k * lda + e] * b[k * ldb + 16n + l] for every e < rows (in
// micro-tiles of up to kMaxR rows) and n < NC: the backward's dQ^T / dK^T / dV^T updates.
inline void acc_panel(const float* a, std::int64_t lda, const float* b, std::int64_t ldb, std::int64_t K,
                      float* c, std::int64_t ldc, std::int64_t rows, int NC) {
  for (std::int64_t e0 = 0; e0 < rows; e0 += kMaxR) {
    const int R = static_cast<int>(rows - e0 < kMaxR ? rows - e0 : kMaxR);
    kAccumulateT[R - 1][NC - 1](a + e0, lda, b, ldb, K, nullptr, c + e0 * ldc, ldc);
  }
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::micro
