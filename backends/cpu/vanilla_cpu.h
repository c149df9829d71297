// VanillaAttn::forward_cpu: scores materialised per (batch, head) with Eigen GEMMs, softmax,
// weighted sum; OpenMP over (batch, head); GQA without copying K/V. q_len == 1 (decode) takes a
// streaming path that reads K/V once per kv head for all its q heads, split along kv across
// threads with a final merge when B x Hkv is small.
#pragma once

#include <cstdint>

#include "attnops/problem.h"

namespace attnops::cpu {

void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers);

// How the materialised-scores path (Tq > kDecodeMaxQ, or weights asked for) divides a call into
// tasks for `threads` threads, and the scratch each thread holds: rows * (D + Tk + Dv) floats,
// at most 16 MiB unless a single row is larger, plus for f16/bf16 a K/V conversion buffer of at
// most 256 rows and at most 16 MiB.
struct VanillaPlan {
  std::int64_t qc = 1;              // q rows per task
  std::int64_t chunks = 1;          // ceil(Tq / qc)
  std::int64_t gc = 1;              // q heads of a GQA group per task
  std::int64_t gslices = 1;         // ceil(G / gc)
  std::int64_t tasks = 0;           // B * Hkv * gslices * chunks
  std::int64_t rows = 1;            // gc * qc: rows of one task's score matrix
  std::int64_t convert_rows = 1;    // K/V rows widened at a time (f16/bf16)
  std::int64_t scratch_floats = 0;  // per thread
};
VanillaPlan vanilla_plan(const AttentionProblem& p, int threads);

}  // namespace attnops::cpu
