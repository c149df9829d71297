// Concurrency: the header promises that every Registry method is thread-safe and that an Attention
// handle can be shared by threads. Checked two ways:
//  * results: 8 threads call every operator x backend over several shapes at once, on shared
//    Attention handles and on handles fetched per call; each output and lse must be bitwise the
//    result of the same call made serially (a race that corrupts data changes bits), and the
//    serial results must match the fp64 oracle;
//  * the race detector: CI runs this binary under TSan (scripts/dev.sh tsan, OMP_NUM_THREADS=1,
//    since libgomp is not instrumented), where any unsynchronised access fails the run.
// Registry::add racing get/list/canonical is exercised on a private registry.
// The GPU rows run on lavapipe under the validation layer (tests/vulkan/vulkan_env.cpp), whose
// thread-safety checks report a Vulkan object used from two threads without synchronisation.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_debug.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

constexpr int kThreads = 8;
constexpr int kCallsPerThread = 24;

// One call of the grid: an operator pinned to a backend on one case.
struct Job {
  std::string op;
  Backend backend;
  Case c;
  OperationMetadata md;
  Attention shared;          // one handle used by every thread
  AttentionOutput expected;  // the serial result
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

bool same_result(const AttentionOutput& a, const AttentionOutput& b) {
  if (!same_bits(a.out, b.out)) return false;
  if (a.lse.has_value() != b.lse.has_value()) return false;
  return !a.lse || same_bits(*a.lse, *b.lse);
}

GpuSettings software_gpu() {
  GpuSettings s;
  s.allow_software = true;
  return s;
}

// The backends this host can run: native and cpu always, gpu when a (software) device qualifies.
std::vector<Backend> backends_here() {
  std::vector<Backend> b = {Backend::native, Backend::cpu};
  if (registry().host().availability(Backend::gpu, software_gpu()).available) b.push_back(Backend::gpu);
  return b;
}

// Shapes that take each operator down its own kernel and, through the default fallbacks, into
// vanilla's general and decode paths: GQA, head_dim not a power of two, Tq != Tk, masks, bias.
std::vector<CaseSpec> shapes() {
  // Filled in place: copying a CaseSpec (its optional<Mask>) draws a GCC 12 -Wmaybe-uninitialized
  // false positive.
  std::vector<CaseSpec> out(4);
  for (CaseSpec& s : out) s.B = 1, s.Hq = 4, s.Hkv = 2;
  CaseSpec& prefill = out[0];  // blocksparse and flash_attn2 run their own tiled kernels
  prefill.Tq = 128, prefill.Tk = 128, prefill.D = 40;
  CaseSpec& odd = out[1];  // Tq % 128 != 0, window, bias: blocksparse -> vanilla (seq_multiple)
  odd.Tq = 37, odd.Tk = 90, odd.D = 24, odd.Hkv = 1, odd.window = Window{20, 0}, odd.bias = true;
  CaseSpec& decode = out[2];  // Tq == 1: vanilla's decode path
  decode.Tq = 1, decode.Tk = 300, decode.D = 40, decode.sinks = true;
  CaseSpec& full = out[3];  // non-causal, segments, f16
  full.Tq = 128, full.Tk = 160, full.D = 40, full.causal = false, full.segments = true,
  full.dtype = DType::f16;
  return out;
}

std::vector<Job> make_jobs() {
  std::vector<Job> jobs;
  std::uint64_t seed = 7;
  for (const std::string& op : registry().list())
    for (Backend b : backends_here())
      for (const CaseSpec& s : shapes()) {
        Job j;
        j.op = op;
        j.backend = b;
        j.c = make_case(s, seed++);
        j.md = registry().entry(op).defaults;  // keep the operator's fallbacks
        j.md.backends = {b};
        j.md.gpu = software_gpu();
        j.shared = registry().get(op, j.md);
        // Only what the operator runs on this backend: ragged_paged has no gpu kernel yet and its
        // cpu kernel no ragged form of bias or segment ids (reasons not_implemented and
        // unsupported_feature for this backend; the dispatcher would move such a call on).
        const DispatchDecision d = j.shared.explain(j.c.q, j.c.k, j.c.v, j.c.options);
        const std::string prefix = std::string(backend_name(b)) + ":";
        const bool cannot = std::any_of(d.reasons.begin(), d.reasons.end(), [&](const Reason& r) {
          return (r.code == ReasonCode::not_implemented || r.code == ReasonCode::unsupported_feature) &&
                 r.detail.rfind(prefix, 0) == 0;
        });
        if (d.backend != b && cannot) continue;
        jobs.push_back(std::move(j));
      }
  return jobs;
}

// Runs every job serially: the expected results, each checked against the oracle.
void run_serially(std::vector<Job>& jobs) {
  for (Job& j : jobs) {
    j.expected = j.shared(j.c.q, j.c.k, j.c.v, j.c.options);
    ASSERT_EQ(j.expected.decision.backend, j.backend) << j.op << " " << j.expected.decision.to_json();
    const AttentionProblem p = make_problem(j.c.q, j.c.k, j.c.v, j.c.options, j.shared.metadata());
    const AttentionBuffers got{j.expected.out, j.expected.lse, j.expected.attention_weights, {}, {}};
    EXPECT_TRUE(within_tolerance(p, got))
        << j.op << " on " << backend_name(j.backend) << " " << j.c.describe();
  }
}

// What the worker threads saw, reported by the main thread (gtest assertions stay there).
struct Findings {
  std::atomic<int> calls{0}, mismatches{0};
  std::mutex mu;
  std::vector<std::string> errors;  // first few mismatches and exceptions
  void note(const std::string& what) {
    std::lock_guard lock(mu);
    if (errors.size() < 8) errors.push_back(what);
  }
};

// kThreads threads, kCallsPerThread calls each, walking the jobs in different orders so that
// different operators and backends overlap. fresh_handle: fetch the Attention from the registry
// on every call instead of sharing the job's handle.
void hammer(const std::vector<Job>& jobs, bool fresh_handle, Findings& f) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        const Job& j = jobs[static_cast<std::size_t>(t * 5 + i * 3) % jobs.size()];
        try {
          const Attention attn = fresh_handle ? registry().get(j.op, j.md) : j.shared;
          const AttentionOutput out = attn(j.c.q, j.c.k, j.c.v, j.c.options);
          ++f.calls;
          if (out.decision.backend != j.backend || !same_result(out, j.expected)) {
            ++f.mismatches;
            f.note(j.op + " on " + std::string(backend_name(j.backend)) + " differs from the serial run (" +
                   j.c.describe() + ") ran " + out.decision.to_json());
          }
        } catch (const std::exception& e) {
          f.note(j.op + " on " + std::string(backend_name(j.backend)) + " threw: " + e.what());
        }
      }
    });
  for (auto& th : threads) th.join();
}

void expect_clean(const Findings& f) {
  EXPECT_EQ(f.calls.load(), kThreads * kCallsPerThread);
  EXPECT_EQ(f.mismatches.load(), 0);
  for (const std::string& e : f.errors) ADD_FAILURE() << e;
}

void expect_no_vulkan_threading_errors() {
  if (!vulkan::debug::validation_enabled()) return;
  const vulkan::debug::ValidationCounts c = vulkan::debug::validation_counts();
  std::string all;
  for (const std::string& m : vulkan::debug::validation_messages()) all += "\n  " + m;
  EXPECT_EQ(c.errors, 0u) << all;
  EXPECT_EQ(c.sync_hazards, 0u) << all;
}

TEST(Concurrency, SharedHandlesGiveTheSerialResults) {
  std::vector<Job> jobs = make_jobs();
  run_serially(jobs);
  if (HasFatalFailure()) return;
  if (vulkan::debug::validation_enabled()) vulkan::debug::reset_validation_counts();
  Findings f;
  hammer(jobs, /*fresh_handle=*/false, f);
  expect_clean(f);
  expect_no_vulkan_threading_errors();
}

TEST(Concurrency, HandlesFetchedPerCallGiveTheSerialResults) {
  std::vector<Job> jobs = make_jobs();
  run_serially(jobs);
  if (HasFatalFailure()) return;
  Findings f;
  hammer(jobs, /*fresh_handle=*/true, f);
  expect_clean(f);
  expect_no_vulkan_threading_errors();
}

// get/make must not read an entry after releasing the lock while add reallocates the entry
// vector. Readers loop over get/canonical/list while the main thread adds 200 operators.
TEST(Concurrency, RegistryAddRacesGet) {
  Registry r;
  register_builtin_operators(r);
  const std::size_t builtin = r.list().size();
  const OperationEntry vanilla = r.entry("vanilla");
  std::atomic<bool> done{false};
  std::atomic<int> gets{0};
  Findings f;
  std::vector<std::thread> readers;
  for (int t = 0; t < kThreads; ++t)
    readers.emplace_back([&] {
      while (!done.load()) {
        try {
          const Attention a = r.get("flash_attn2");
          if (a.name() != "flash_attn2" || r.canonical("flash") != "flash_attn2")
            f.note("wrong operator returned");
          if (r.list().size() < 3) f.note("list() lost the built-in operators");
          ++gets;
        } catch (const std::exception& e) {
          f.note(std::string("reader threw: ") + e.what());
        }
      }
    });
  for (int i = 0; i < 200; ++i) {
    OperationEntry e = vanilla;
    e.name = "extra_" + std::to_string(i);
    e.aliases = {"extra_alias_" + std::to_string(i)};
    r.add(std::move(e));
    if (i % 20 == 0) std::this_thread::yield();
  }
  done = true;
  for (auto& th : readers) th.join();
  for (const std::string& e : f.errors) ADD_FAILURE() << e;
  EXPECT_GT(gets.load(), 0);
  EXPECT_EQ(r.list().size(), builtin + 200);
  EXPECT_EQ(r.canonical("extra_alias_199"), "extra_199");
  EXPECT_EQ(r.get("extra_57").name(), "extra_57");
}

}  // namespace
}  // namespace attnops::testing
