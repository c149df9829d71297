// vanilla cpu's working set is bounded, and allocation failures are typed errors.
//
// Before: each thread held G x Tk scores (G = q heads per kv head) whatever its 16 MiB "cap"
// said: q [1, 8, 512, 1] with k, v [1, 2^20, 1, 1] (8 MB of input) peaked at 4.3 GB, and when
// memory ran short std::bad_alloc was thrown inside the OpenMP region (std::terminate).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/vanilla_cpu.h"

namespace attnops {
namespace {

constexpr std::int64_t kCapBytes = std::int64_t{16} << 20;

// A problem over broadcast views (one row of D zeros, outer strides 0): any shape costs no memory
// (and no copy in make_problem) until a kernel allocates.
AttentionProblem broadcast_problem(std::int64_t Tq, std::int64_t Hq, std::int64_t Tk, std::int64_t Hkv,
                                   std::int64_t D, DType dt = DType::f32) {
  static const std::vector<float> zeros(std::size_t{1} << 20);  // as many bytes as D <= 2^20 f32
  const TensorView q(zeros.data(), dt, {1, Tq, Hq, D}, {0, 0, 0, 1}),
      k(zeros.data(), dt, {1, Tk, Hkv, D}, {0, 0, 0, 1});
  OperationMetadata md;
  return make_problem(q, k, k, {.causal = false}, md);
}

TEST(VanillaWorkingSet, PlanStaysWithinTheCapOrOneRow) {
  struct Shape {
    std::int64_t Tq, Hq, Tk, Hkv, D;
  };
  for (const Shape& s :
       {Shape{8, 512, 1 << 20, 1, 1}, Shape{8, 8, 1 << 22, 1, 1}, Shape{300, 64, 65536, 2, 128},
        Shape{5, 4, 1 << 24, 4, 1}, Shape{2048, 16, 2048, 16, 128}, Shape{16, 32, 8, 1, 1 << 20}})
    for (DType dt : {DType::f32, DType::bf16})
      for (int threads : {1, 2, 16}) {
        const AttentionProblem p = broadcast_problem(s.Tq, s.Hq, s.Tk, s.Hkv, s.D, dt);
        const cpu::VanillaPlan pl = cpu::vanilla_plan(p, threads);
        // Scores, queries and outputs: the cap, or one row when that is larger; plus, for f16 /
        // bf16, the K/V conversion buffer of at most 256 rows, itself within the cap.
        const std::int64_t one_row = (p.Tk + p.D + p.Dv) * 4;
        const std::int64_t convert =
            dt == DType::f32 ? 0 : std::min(kCapBytes, 256 * std::max(p.D, p.Dv) * 4);
        SCOPED_TRACE("Tq=" + std::to_string(s.Tq) + " Hq=" + std::to_string(s.Hq) +
                     " Tk=" + std::to_string(s.Tk) + " D=" + std::to_string(s.D) +
                     " threads=" + std::to_string(threads));
        EXPECT_LE(pl.scratch_floats * 4, std::max(kCapBytes, one_row) + convert);
        // Every (batch, kv head, q head, query) is covered exactly once by the tasks.
        EXPECT_EQ(pl.chunks * pl.qc >= p.Tq && (pl.chunks - 1) * pl.qc < p.Tq, true);
        EXPECT_EQ(pl.gslices * pl.gc >= p.group() && (pl.gslices - 1) * pl.gc < p.group(), true);
        EXPECT_EQ(pl.tasks, p.B * p.Hkv * pl.gslices * pl.chunks);
      }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// G = 512 q heads per kv head and 2^18 keys, sized to run in about a second: scores for the
// whole group would hold 512 x 2^18 floats (512 MiB) per thread; the kernel needs 16 MiB.
TEST(VanillaWorkingSet, GqaGroupTimesKeysNoLongerMaterialised) {
  // Under ASan the peak RSS also counts shadow memory and the quarantine of freed blocks (up to
  // 256 MiB), so it says nothing about the kernel's working set; PlanStaysWithinTheCapOrOneRow
  // checks the plan in every build.
  if (kSanitized) GTEST_SKIP() << "peak RSS is not the working set under a sanitizer";
  const std::int64_t Tq = 5, Hq = 512, Tk = std::int64_t{1} << 18;  // Tq > 4: the GEMM path
  Tensor q(DType::f32, {1, Tq, Hq, 1}), k(DType::f32, {1, Tk, 1, 1}), v(DType::f32, {1, Tk, 1, 1});
  for (std::int64_t i = 0; i < q.numel(); ++i)
    q.set(static_cast<std::size_t>(i), 0.001f * static_cast<float>(i % 7));
  for (std::int64_t i = 0; i < Tk; ++i) {
    k.set(static_cast<std::size_t>(i), static_cast<float>(i % 13) / 13.f);
    v.set(static_cast<std::size_t>(i), static_cast<float>(i % 5));
  }
  OperationMetadata md;
  md.backends = {Backend::cpu};
  const long before = peak_rss_kib();
  const AttentionOutput out = registry().get("vanilla", md)(q, k, v, {.causal = false});
  const long grown_mib = (peak_rss_kib() - before) / 1024;
  EXPECT_EQ(out.decision.backend, Backend::cpu);
  EXPECT_LT(grown_mib, 200) << "peak RSS grew by " << grown_mib << " MiB";
  for (std::int64_t i = 0; i < out.out.numel(); ++i) {
    const float o = out.out.at(static_cast<std::size_t>(i));
    ASSERT_TRUE(o >= 0.f && o <= 4.f) << "out[" << i << "] = " << o;  // a convex combination of v
  }
}

long vm_size_bytes() {
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return pages * 4096;
}

// A kernel's scratch that cannot be allocated is an Error(out_of_memory) thrown to the caller,
// not std::bad_alloc escaping the OpenMP region (which terminates the process). The address
// space is capped just above its current size; one score row of 2^25 keys (128 MiB per thread)
// cannot fit.
TEST(TypedAllocationErrors, VanillaScratchBeyondTheAddressSpaceLimit) {
  if (kSanitized) GTEST_SKIP() << "sanitizers reserve address space; RLIMIT_AS cannot be lowered under them";
  const AttentionProblem warm = broadcast_problem(5, 2, 64, 1, 4);
  registry().get("vanilla", OperationMetadata{})(warm.q, warm.k, warm.v,
                                                 {.causal = false});  // threads started
  const AttentionProblem p = broadcast_problem(5, 1, std::int64_t{1} << 25, 1, 1);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(vm_size_bytes() + (std::int64_t{96} << 20));
  if (old.rlim_cur != RLIM_INFINITY && low.rlim_cur > old.rlim_cur) GTEST_SKIP() << "RLIMIT_AS already lower";
  ASSERT_EQ(setrlimit(RLIMIT_AS, &low), 0);
  ErrorCode code = ErrorCode::internal;
  std::string what;
  try {
    OperationMetadata md;
    md.backends = {Backend::cpu};
    md.num_threads = 2;
    registry().get("vanilla", md)(p.q, p.k, p.v, {.causal = false});
  } catch (const Error& e) {
    code = e.code();
    what = e.what();
  } catch (const std::bad_alloc&) {
    what = "std::bad_alloc";
  }
  setrlimit(RLIMIT_AS, &old);
  EXPECT_EQ(code, ErrorCode::out_of_memory) << what;
  EXPECT_NE(what.find("vanilla cpu"), std::string::npos) << what;
}

}  // namespace
}  // namespace attnops
