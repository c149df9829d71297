// Decode path of VanillaAttn::forward_cpu: few query rows (q_len <= kDecodeMaxQ) against a long
// KV cache. Memory bound, so K and V are streamed exactly once, in address order: a task owns a
// range of kv positions of one batch for all kv heads, and the G * Tq query rows of each kv
// head's group (GQA) all use each K and V row while it is in cache; an online softmax folds the
// values in block by block. The kv axis is split into enough ranges to keep every thread busy
// even at B = 1; the partial (max, sum, output) triples are merged by log-sum-exp in split order,
// so a given thread count always gives the same bits.
#pragma once

#include <cstdint>

#include "attnops/ext/problem.h"

namespace attnops::cpu {

// Largest q_len the decode path takes (beyond it the GEMM path wins).
inline constexpr std::int64_t kDecodeMaxQ = 4;

// The kernel itself is per tier (vanilla_decode.cpp, TierKernels::vanilla_decode); it requires
// p.Tq <= kDecodeMaxQ and !p.want_weights, and runs vanilla_decode_splits(p, threads) splits.

// A kv split shorter than this costs more in task overhead and merging than it gains.
inline constexpr std::int64_t kMinSplitKeys = 128;

// How many pieces the kv axis of each (batch, kv head) is split into for `threads` threads;
// exposed so tests can assert that a shape really takes the split path.
std::int64_t vanilla_decode_splits(const AttentionProblem& p, int threads);

}  // namespace attnops::cpu
