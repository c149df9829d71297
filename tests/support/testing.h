// Test support shared by every test area: deterministic random inputs and comparison of a
// kernel's buffers with the fp64 oracle under per-dtype tolerances.
//
// Tolerances (absolute, on outputs whose values are convex combinations of v in [-1, 1]):
//   f32  out 2e-5, lse 1e-4     (fp32 accumulation vs fp64)
//   f16  out 2e-3, lse 1e-3     (output rounded to binary16: half-ulp at 1.0 is 4.9e-4)
//   bf16 out 1.6e-2, lse 1e-3   (output rounded to bfloat16: half-ulp at 1.0 is 3.9e-3)
// The oracle reads the same (already rounded) f16/bf16 inputs, so input rounding is not error.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/tier_kernels.h"
#include "backends/native/reference.h"

namespace attnops::testing {

struct Tolerance {
  double out;
  double lse;
};
Tolerance tolerance_for(DType t);

// How many cases a random sweep registers: `n`, or fewer when ATTNOPS_TEST_RANDOM_CASES says so
// (the sanitizer stage runs the first few of each sweep: it looks for memory and UB errors, which
// the hand-picked cases and a sample of random ones reach, not for numerical coverage).
int random_case_count(int n);

// Uniform in [lo, hi), rounded to `dtype`; same seed, same tensor.
Tensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed, float lo = -1.f,
                     float hi = 1.f);
// Segment ids [B, T] i32: runs of random lengths (1..max_run) with increasing ids.
Tensor random_segments(std::int64_t B, std::int64_t T, std::uint64_t seed, std::int64_t max_run = 40);

// One random case: shapes, dtype and the options exercised. Owns the tensors the options view.
struct Case {
  std::int64_t B = 1, Tq = 1, Tk = 1, Hq = 1, Hkv = 1, D = 8, Dv = 8;
  DType dtype = DType::f32;
  AttentionOptions options;
  Tensor q, k, v;
  std::optional<Tensor> seg_q, seg_kv, bias, sinks;
  std::string describe() const;  // for failure messages
};

struct CaseSpec {
  std::int64_t B = 1, Tq = 1, Tk = 1, Hq = 1, Hkv = 1, D = 8;
  std::int64_t Dv = -1;  // -1 = D
  DType dtype = DType::f32;
  bool causal = true;
  std::optional<Window> window;
  std::optional<std::int64_t> chunk;
  bool segments = false;
  bool bias = false;
  bool bias_broadcast = false;  // [1, 1, Tq, Tk] instead of [B, Hq, Tq, Tk]
  std::optional<double> soft_cap;
  bool sinks = false;
  std::optional<Mask> mask;
  bool return_lse = true;
  float scale_inputs = 1.f;  // multiply q by this (large values stress the online softmax)
};
Case make_case(const CaseSpec& spec, std::uint64_t seed);

// A problem for a case, with default metadata (optionally given block sizes).
AttentionProblem problem_for(const Case& c, std::int64_t bq = 128, std::int64_t bk = 128,
                             std::optional<DType> runtime_dtype = std::nullopt);

struct Comparison {
  double max_out_err = 0;          // max |out - oracle|
  double max_lse_err = 0;          // over rows finite in both
  bool lse_inf_rows_match = true;  // -inf exactly where the oracle has -inf
  bool out_finite = true;          // no NaN / inf anywhere in out
  std::string where;               // location of the worst out error
};
// Compares `got` with the fp64 oracle for problem p (lse only if got.lse is set).
Comparison compare_with_oracle(const AttentionProblem& p, const AttentionBuffers& got);
// The same against an oracle result computed once (several kernels checked on one case).
Comparison compare_with_reference(const AttentionProblem& p, const native::ReferenceResult& ref,
                                  const AttentionBuffers& got);

// gtest assertion helper: EXPECT_TRUE(within_tolerance(p, got)) prints the comparison.
::testing::AssertionResult within_tolerance(const AttentionProblem& p, const AttentionBuffers& got,
                                            std::optional<Tolerance> tol = std::nullopt);
::testing::AssertionResult within_tolerance(const AttentionProblem& p, const native::ReferenceResult& ref,
                                            const AttentionBuffers& got,
                                            std::optional<Tolerance> tol = std::nullopt);

// The CPU ISA tiers the kernel tests run: every tier from baseline up to the one the backend
// chooses now (the detected tier, capped by ATTNOPS_CPU_ISA), so that `ATTNOPS_CPU_ISA=avx2
// ctest` tests baseline and avx2 only. Tiers above are the CPU's (or the cap's) to refuse; the
// tests in tests/tiers report them as skipped with the reason.
std::vector<cpu::Isa> cpu_tiers_to_test();
// "tier avx2" for failure messages.
std::string tier_label(cpu::Isa isa);

// The kernel tests' tiers: cpu_tiers_to_test(), then the emulated builds of the tiers above the
// chosen one (the avx512bf16 and amx kernels compiled with the avx2 flags, their instructions
// beyond AVX2 in C++: backends/cpu/simd16_bf16.h, amx_tiles.h) where this CPU runs AVX2, so that
// every tier's code runs against the oracle on any x86-64 machine with AVX2.
std::vector<cpu::ForcedTier> cpu_kernel_tiers_to_test();
// The emulated tiers' tables in this build (none off x86-64).
std::vector<const cpu::TierKernels*> emulated_tier_tables();
// "tier amx (emulated)" for failure messages.
std::string tier_label(const cpu::ForcedTier& tier);

}  // namespace attnops::testing
