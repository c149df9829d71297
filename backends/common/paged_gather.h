// One sequence of a paged call as a dense problem (baseline code, shared by the native backend's
// oracle and the cpu backend's tile items): its keys gathered from the pages into contiguous
// k [1, T, Hkv, D] / v [1, T, Hkv, Dv] host tensors, its q rows as a view [1, q_len, Hq, D], and
// the dense call's options and metadata that give exactly the paged semantics.
#pragma once

#include <cstdint>
#include <optional>

#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "attnops/options.h"

namespace attnops::paged {

struct DenseSequence {
  Tensor k, v;                 // keys [first, kv_len) of the sequence, contiguous
  TensorView q;                // [1, q_len, Hq, D], a view of the call's q (or of q_copy)
  Tensor q_copy;               // q in the keys' dtype when it differs from the call's
  std::int64_t first = 0;      // the first key gathered (0, or a lower bound of what the rows see)
  AttentionOptions options;    // causal / window / chunk / soft cap / sinks / lse as the paged call
  OperationMetadata metadata;  // softmax_scale and num_threads of the paged call
};

// Sequence s with keys [first, kv_len) (first = 0 for the exact oracle; a tile item may start at
// the lowest key any of its rows sees, rounded down to a chunk boundary, which leaves every
// relative position and chunk unchanged). Host pools only.
// gather = false: k and v allocated only, for gather_rows to fill (a caller copying in parallel).
// The keys and values come in dtype `as` (default: the problem's dtype): a float cache's own (`as`
// must be it), or an 8-bit cache's values code x scale rounded to `as` (f32: exactly gather()'s;
// the native oracle's choice); q is converted to `as` when it differs (exactly: a widening).
DenseSequence dense_sequence(const PagedProblem& p, std::int64_t s, std::int64_t first = 0,
                             bool gather = true, std::optional<DType> as = std::nullopt);
// Keys [x.first + lo, x.first + hi) of sequence s into rows [lo, hi) of x.k / x.v.
void gather_rows(const PagedProblem& p, std::int64_t s, DenseSequence& x, std::int64_t lo, std::int64_t hi);

// The dense call's outputs (out [1, q_len, Hq, Dv] in the problem's dtype or in f32, then rounded
// to it; lse [1, Hq, q_len]) copied into the paged buffers' rows of sequence s (out [N, Hq, Dv],
// lse [N, Hq]).
void scatter_outputs(const PagedProblem& p, std::int64_t s, const AttentionBuffers& dense, PagedBuffers& out);
// The same for the dense call's q rows [lo, hi) only.
void scatter_rows(const PagedProblem& p, std::int64_t s, const AttentionBuffers& dense, PagedBuffers& out,
                  std::int64_t lo, std::int64_t hi);

}  // namespace attnops::paged
