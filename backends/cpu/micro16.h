// Register-blocked micro-kernels on simd16.h's V16, the two shapes every tiled CPU kernel is made
// of: R rows of broadcast scalars times NC vectors of 16 lanes, R x NC accumulators in registers
// (at most 6 x 4 = 24 zmm), loop trip counts free (any head dim, any block size).
//   dot_micro  c[r][l]  = sum_k a[r][k] * bt[k][l]    (overwrite; e.g. S^T = K Q^T, S = Q K^T)
//   acc_micro  c[e][l] += sum_k a[k][e] * bt[k][l]    (accumulate; e.g. O^T += V^T-broadcast P^T)
// Matrices are row-major with leading dimensions (lda, ldb, ldc in floats); bt and c rows hold
// 16 * NC lanes. The forward's qk_micro / pv_micro (tiled_cpu.cpp) are the same two shapes.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "backends/cpu/simd16.h"

namespace attnops::cpu::micro {

using simd::V16;
using i64 = std::int64_t;

inline constexpr int kMaxR = 6;   // broadcast rows per micro-tile
inline constexpr int kMaxNC = 4;  // 16-lane vectors per micro-tile

// c[r][l] = sum_{k < n} a[r * lda + k] * bt[k * ldb + l]   for r < R, l < 16 * NC (overwrites c).
template <int R, int NC>
void dot_micro(const float* bt, i64 ldb, const float* a, i64 lda, i64 n, float* c, i64 ldc) {
  V16 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NC; ++v) acc[r][v] = simd::zero();
  for (i64 k = 0; k < n; ++k) {
    V16 b[NC];
    for (int v = 0; v < NC; ++v) b[v] = simd::load(bt + k * ldb + 16 * v);
    for (int r = 0; r < R; ++r) {
      const V16 x = simd::set1(a[r * lda + k]);
      for (int v = 0; v < NC; ++v) acc[r][v] = simd::fma(x, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NC; ++v) simd::store(c + r * ldc + 16 * v, acc[r][v]);
}

// c[e][l] += sum_{k < n} a[k * lda + e] * bt[k * ldb + l]   for e < R, l < 16 * NC.
template <int R, int NC>
void acc_micro(const float* bt, i64 ldb, const float* a, i64 lda, i64 n, float* c, i64 ldc) {
  V16 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NC; ++v) acc[r][v] = simd::load(c + r * ldc + 16 * v);
  for (i64 k = 0; k < n; ++k) {
    V16 b[NC];
    for (int v = 0; v < NC; ++v) b[v] = simd::load(bt + k * ldb + 16 * v);
    const float* ak = a + k * lda;
    for (int r = 0; r < R; ++r) {
      const V16 x = simd::set1(ak[r]);
      for (int v = 0; v < NC; ++v) acc[r][v] = simd::fma(x, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NC; ++v) simd::store(c + r * ldc + 16 * v, acc[r][v]);
}

using MicroFn = void (*)(const float*, i64, const float*, i64, i64, float*, i64);
template <int R>
constexpr std::array<MicroFn, kMaxNC> dot_row() {
  return {dot_micro<R, 1>, dot_micro<R, 2>, dot_micro<R, 3>, dot_micro<R, 4>};
}
template <int R>
constexpr std::array<MicroFn, kMaxNC> acc_row() {
  return {acc_micro<R, 1>, acc_micro<R, 2>, acc_micro<R, 3>, acc_micro<R, 4>};
}
// Indexed [R - 1][NC - 1]; edges use the smaller shapes.
inline constexpr std::array<std::array<MicroFn, kMaxNC>, kMaxR> kDot = {
    dot_row<1>(), dot_row<2>(), dot_row<3>(), dot_row<4>(), dot_row<5>(), dot_row<6>()};
inline constexpr std::array<std::array<MicroFn, kMaxNC>, kMaxR> kAcc = {
    acc_row<1>(), acc_row<2>(), acc_row<3>(), acc_row<4>(), acc_row<5>(), acc_row<6>()};

// c[e][16 * NC lanes] += a-broadcast x bt over k < n, for every e < rows (in micro-tiles of R).
inline void acc_panel(const float* bt, i64 ldb, const float* a, i64 lda, i64 n, float* c, i64 ldc, i64 rows,
                      int NC) {
  for (i64 e0 = 0; e0 < rows; e0 += kMaxR) {
    const int R = static_cast<int>(std::min<i64>(kMaxR, rows - e0));
    kAcc[R - 1][NC - 1](bt, ldb, a + e0, lda, n, c + e0 * ldc, ldc);
  }
}

}  // namespace attnops::cpu::micro
