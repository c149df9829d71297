// VanillaAttn::forward_cpu: scores materialised per (batch, kv head, q chunk) with micro-kernel
// GEMMs, softmax, weighted sum; OpenMP over tasks; GQA without copying K/V. q_len <= 4 (decode)
// takes a streaming path that reads K/V once per kv head for all its q heads, split along kv
// across threads with a final merge when B x Hkv is small. Both are compiled once per ISA tier
// (backends/cpu/README.md); these entry points pick the path and the tier and report them in
// buffers.run.
#pragma once

#include <cstdint>

#include "attnops/ext/problem.h"
#include "backends/cpu/isa.h"

namespace attnops::cpu {

void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers);
// With a given tier instead of the chosen one (tests: a tier of this build, or an emulated
// build's table). Error backend_unavailable when the CPU does not run `tier` or this build lacks it.
void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers, ForcedTier tier);

// How the materialised-scores path (Tq > kDecodeMaxQ, or weights asked for) divides a call into
// tasks for `threads` threads, and the scratch each thread holds (vanilla_plan.cpp). A task is
// (batch, kv head, gc q heads of its GQA group, qc q rows); its rows' scores, queries and
// outputs, rows * (Tk + D + Dv) floats, stay within max_working_floats (16 MiB) per thread unless
// a single row is larger, plus for f16/bf16 a K/V conversion buffer of at most 256 rows and at
// most 16 MiB. Two layouts (vanilla_cpu.cpp):
//   lanes over rows  S^T [Tk][rows rounded up to 16], the tiled kernel's layout (the fast one);
//                    taken when 16 rows fit the cap (Tk up to about 260k)
//   row-major        S [rows][Tk], one row at a time, for keys so many that 16 rows would not fit
struct VanillaPlan {
  std::int64_t qc = 1;              // q rows per task
  std::int64_t chunks = 1;          // ceil(Tq / qc)
  std::int64_t gc = 1;              // q heads of a GQA group per task
  std::int64_t gslices = 1;         // ceil(G / gc)
  std::int64_t tasks = 0;           // B * Hkv * gslices * chunks
  std::int64_t rows = 1;            // gc * qc: rows of one task's score matrix
  bool lanes_over_rows = true;      // the S^T layout (else row-major)
  std::int64_t lanes = 1;           // rows rounded up to 16 (lanes over rows), else rows
  std::int64_t convert_rows = 1;    // K/V rows per block (widened to f32 for f16/bf16)
  std::int64_t scratch_floats = 0;  // per thread, every buffer counted
};
inline constexpr std::int64_t kVanillaMaxWorkingFloats = std::int64_t{1} << 22;  // 16 MiB
VanillaPlan vanilla_plan(const AttentionProblem& p, int threads,
                         std::int64_t max_working_floats = kVanillaMaxWorkingFloats);

// The materialised-scores path with a given plan and tier (tests: a small cap forces the
// row-major layout and GQA-group splits on small shapes). Validation as vanilla_attention.
void vanilla_general(const AttentionProblem& p, AttentionBuffers& buffers, ForcedTier tier,
                     const VanillaPlan& plan);

}  // namespace attnops::cpu
