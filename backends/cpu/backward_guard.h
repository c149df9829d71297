// The backward's guard for non-finite inputs (per-tier header, included by tiled_backward.cpp).
//
// The policy (README, "Gradients"): a masked pair (i, j) contributes nothing, even when q_i, k_j,
// v_j or dout_i hold NaN or inf; visible pairs follow IEEE arithmetic. The kernels select dS and
// P to 0 at masked pairs, but three products broadcast one operand row over a vector of pairs,
// dQ^T += K[j] x dS^T (lanes: query rows), dK^T += Q[i] x dS and dV^T += dO[i] x P (lanes: keys),
// and there a NaN / inf in that row would still reach a masked lane through 0 x inf. So rows of
// q, dout and k that hold a NaN or inf are flagged once per call (one pass over those inputs,
// small next to the backward), and a flagged row's update goes only to the lanes of its visible
// pairs. Finite inputs flag nothing: the kernels then run the plain products, bit for bit.
#pragma once

#if !defined(ATTNOPS_TIER_NS)
#error "backends/cpu/backward_guard.h is only for per-tier kernel sources (see backends/cpu/README.md)"
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "attnops/tensor.h"
#include "backends/cpu/micro_kernels.h"
#include "backends/cpu/pool_for.h"
#include "backends/cpu/simd16.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::guard {

using i64 = std::int64_t;
using simd::Mask16;
using simd::V16;

// c[e][16n + l] += a[e] * b[16n + l] for e < rows, n < NC, only in the lanes of vis[n]: one
// broadcast row's update that a masked lane (where b is a selected 0) must not see.
inline void acc_row_masked(const float* a, const float* b, float* c, i64 ldc, i64 rows, int NC,
                           const Mask16* vis) {
  for (i64 e = 0; e < rows; ++e) {
    const V16 ae = simd::set1(a[e]);
    for (int n = 0; n < NC; ++n) {
      float* ce = c + e * ldc + 16 * n;
      simd::store(ce, simd::fma_masked(vis[n], ae, simd::load(b + 16 * n), simd::load(ce)));
    }
  }
}

// micro::acc_panel (c[e][lanes] += sum_k a[k][e] * b[k][lanes]) where the rows k flagged in
// bad[k * bad_stride] (a NaN or inf in a[k]) add only in their visible lanes vis[k * kMaxNC + n].
// The unflagged runs go through acc_panel; every c element still sums its terms in k order.
inline void acc_panel_guarded(const float* a, i64 lda, const float* b, i64 ldb, i64 K, float* c, i64 ldc,
                              i64 rows, int NC, const std::uint8_t* bad, i64 bad_stride, const Mask16* vis) {
  i64 k0 = 0;
  for (i64 k = 0; k <= K; ++k) {
    if (k < K && !bad[k * bad_stride]) continue;
    if (k > k0) micro::acc_panel(a + k0 * lda, lda, b + k0 * ldb, ldb, k - k0, c, ldc, rows, NC);
    if (k < K) acc_row_masked(a + k * lda, b + k * ldb, c, ldc, rows, NC, vis + k * micro::kMaxNC);
    k0 = k + 1;
  }
}

// flags[(b * T + i) * H + h] = 1 where row (b, i, h) of the BTHD view `t` (n elements of `dtype`)
// holds a NaN or inf (x * 0 is NaN exactly for those). row_buffer(slot) gives each thread of the
// work pool (work_pool.h) a scratch row of n floats. Returns whether any row is flagged. Rows
// are handed out kFlagRowsPerTask at a time; in parallel only when there is enough to share (a
// parallel call costs more than a small scan).
inline constexpr i64 kFlagRowsPerTask = 64;

template <class RowBuffer>
bool flag_nonfinite_rows(const TensorView& t, DType dtype, i64 n, int nt, const RowBuffer& row_buffer,
                         std::uint8_t* flags) {
  const i64 T = t.dim(1), H = t.dim(2), rows = t.dim(0) * T * H;
  const auto esize = static_cast<i64>(dtype_size(dtype));
  std::atomic<bool> any{false};
  auto flag_rows = [&](int slot, i64 task) {
    float* row = row_buffer(slot);
    bool found = false;
    const i64 r1 = std::min(rows, (task + 1) * kFlagRowsPerTask);
    for (i64 r = task * kFlagRowsPerTask; r < r1; ++r) {
      const i64 b = r / (T * H), i = (r / H) % T, h = r % H;
      const char* src =
          static_cast<const char*>(t.data()) + (b * t.stride(0) + i * t.stride(1) + h * t.stride(2)) * esize;
      simd::convert_row(src, dtype, n, row);
      float acc = 0.f;
      for (i64 e = 0; e < n; ++e) acc += row[e] * 0.f;
      flags[r] = acc == 0.f ? 0 : 1;
      found = found || flags[r] != 0;
    }
    if (found) any.store(true, std::memory_order_relaxed);
  };
  pool_for(rows * n >= (i64{1} << 18) ? nt : 1, (rows + kFlagRowsPerTask - 1) / kFlagRowsPerTask, flag_rows);
  return any.load(std::memory_order_relaxed);  // pool_for returned: every task's store is visible
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::guard
