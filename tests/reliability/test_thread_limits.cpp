// Absurd thread counts: `--threads 100000` (or num_threads: 100000 in YAML) would overflow an
// OpenMP region's thread stacks (SIGSEGV), 2^31-1 makes libgomp abort with "Out of memory", and
// 30000 would start 30000 threads. The count is clamped to
// max_worker_threads() (the hardware threads) in make_problem, for every backend and every
// source of the setting, and OpenMP's own default is clamped by worker_threads().
#include <gtest/gtest.h>
#include <omp.h>

#include <climits>
#include <cmath>
#include <string>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/common/threads.h"
#include "backends/native/reference.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

constexpr int kAbsurd[] = {100000, 30000, INT_MAX};

TEST(ThreadLimits, MakeProblemClampsToTheHardwareThreads) {
  const Case c = make_case(CaseSpec{}, 1);
  for (int n : kAbsurd) {
    OperationMetadata md;
    md.num_threads = n;
    EXPECT_EQ(make_problem(c.q, c.k, c.v, c.options, md).num_threads, max_worker_threads()) << n;
  }
  OperationMetadata one;
  one.num_threads = 1;
  EXPECT_EQ(make_problem(c.q, c.k, c.v, c.options, one).num_threads, 1);
  EXPECT_GE(max_worker_threads(), 1);
}

TEST(ThreadLimits, WorkerThreadsClampsOpenMPsDefault) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(100000);  // as OMP_NUM_THREADS=100000 would
  EXPECT_EQ(worker_threads(0), max_worker_threads());
  EXPECT_EQ(worker_threads(INT_MAX), max_worker_threads());
  omp_set_num_threads(before);
  EXPECT_EQ(worker_threads(1), 1);
}

double max_error(const Tensor& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got.at(i) - want[i]));
  return worst;
}

// Every CPU kernel (vanilla's GEMM and decode paths, the tiled kernel of flash and blocksparse)
// runs correctly with absurd counts, whether they come from metadata or from YAML.
TEST(ThreadLimits, EveryCpuKernelRunsWithAbsurdCounts) {
  for (const char* op : {"vanilla", "flash_attn2", "blocksparse"})
    for (std::int64_t Tq : {1, 33, 256})
      for (int n : kAbsurd) {
        SCOPED_TRACE(std::string(op) + " Tq=" + std::to_string(Tq) + " threads=" + std::to_string(n));
        CaseSpec s;
        s.Tq = Tq, s.Tk = 256, s.Hq = 4, s.Hkv = 2, s.D = 16;
        const Case c = make_case(s, 5);
        const Config cfg =
            parse_config("backend: cpu\nnum_threads: " + std::to_string(n) + "\noperators: {" + op +
                         ": {fallbacks: {decode: false, non_causal: false, seq_multiple: false}}}\n");
        const AttentionOutput out = registry().get(op, cfg)(c.q, c.k, c.v, c.options);
        EXPECT_EQ(out.decision.backend, Backend::cpu);
        EXPECT_EQ(out.decision.op, op);
        const auto want = native::reference_attention_f64(make_problem(c.q, c.k, c.v, c.options, {}), false);
        EXPECT_LE(max_error(out.out, want.out), 2e-5);
      }
}

}  // namespace
}  // namespace attnops::testing
