// Shared prefixes (PagedAttentionOptions::share_prefixes): sequences whose first keys lie in the
// same pages have those splits read once for all of them, and each sequence's output and lse are
// bitwise those of the unshared run and of the sequence alone, at 1, 2 and 3 threads, on every cpu
// ISA tier here; groups of 1..8 sequences, prefixes shorter than, equal to and longer than one
// split, sequences sharing only some pages, 8-bit caches.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "attnops/ext/paged_problem.h"
#include "backends/cpu/paged_cpu.h"
#include "tests/paged/paged_cases.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using ::testing::HasSubstr;
using i64 = std::int64_t;

AttentionOutput run_tier(const PagedCase& c, const RaggedBatch& batch, const Tensor& q, bool share,
                         cpu::Isa tier, int threads) {
  OperationMetadata md;
  md.num_threads = threads;
  PagedAttentionOptions o = c.options;
  o.share_prefixes = share;
  const PagedPlan plan = plan_paged(batch, c.cache.spec(), q.dim(0), c.spec.Hq, o);
  const PagedProblem p = make_paged_problem(q, c.cache, plan, o, md);
  PagedBuffers b = allocate_paged_buffers(p);
  cpu::paged_attention(p, b, tier);
  AttentionOutput out;
  out.out = b.out;
  out.lse = b.lse;
  out.decision.run = b.run;
  return out;
}

// Rows [q0, q0 + ql) of a against rows [0, ql) of b, out and lse, bitwise.
::testing::AssertionResult same_rows(const AttentionOutput& a, i64 q0, const AttentionOutput& b, i64 b0,
                                     i64 ql, i64 Hq, i64 Dv) {
  const std::size_t es = dtype_size(a.out.dtype());
  const auto* x = static_cast<const char*>(a.out.data()) + static_cast<std::size_t>(q0 * Hq * Dv) * es;
  const auto* y = static_cast<const char*>(b.out.data()) + static_cast<std::size_t>(b0 * Hq * Dv) * es;
  if (std::memcmp(x, y, static_cast<std::size_t>(ql * Hq * Dv) * es) != 0)
    return ::testing::AssertionFailure() << "outputs of rows " << q0 << "..+" << ql << " differ";
  if (std::memcmp(a.lse->data_as<float>() + q0 * Hq, b.lse->data_as<float>() + b0 * Hq,
                  static_cast<std::size_t>(ql * Hq) * 4u) != 0)
    return ::testing::AssertionFailure() << "lse of rows " << q0 << "..+" << ql << " differ";
  return ::testing::AssertionSuccess();
}

struct ShareCase {
  const char* name;
  std::vector<i64> q_lens, kv_lens, share_from, share_tokens;
  i64 split;
  i64 expect_shared_keys;  // the plan's shared_keys
};

std::vector<ShareCase> share_cases() {
  return {
      // One sequence: nothing to share with.
      {"alone", {1}, {100}, {-1}, {0}, 32, 0},
      // Two sequences, a prefix shorter than one split: no whole split in common.
      {"short prefix", {1, 1}, {60, 70}, {-1, 0}, {16, 16}, 32, 0},
      // A prefix of exactly one split, then their own keys.
      {"one split", {1, 1, 1}, {50, 33, 90}, {-1, 0, 0}, {32, 32, 32}, 32, 32},
      // A prefix of 2.5 splits shared by 8 sequences (two of them speculative: 3 rows), whose
      // second split is its last for some: 80 of them shared by 4+ sequences, 64 of them by all.
      {"eight",
       {1, 1, 3, 1, 1, 1, 3, 1},
       {80, 100, 95, 130, 81, 200, 84, 300},
       {-1, 0, 0, 0, 0, 0, 0, 0},
       {80, 80, 80, 80, 80, 80, 80, 80},
       32,
       -1},
      // Sequences sharing only some pages: 2 shares 16 keys with 0, which shares 64 with 1; 3
      // shares a whole sequence (equal kv_len, one split) with 4.
      {"partial", {1, 1, 1, 1, 1}, {90, 100, 70, 24, 24}, {-1, 0, 0, -1, 3}, {0, 64, 16, 0, 24}, 32, -1},
  };
}

class SharedPrefix : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(SharedPrefix, OutputsAreBitwiseThoseOfTheUnsharedRunAndOfEachSequenceAlone) {
  const ShareCase sc = share_cases()[static_cast<std::size_t>(std::get<0>(GetParam()))];
  const int variant = std::get<1>(GetParam());
  PagedCaseSpec spec;
  spec.q_lens = sc.q_lens, spec.kv_lens = sc.kv_lens;
  spec.share_from = sc.share_from, spec.share_tokens = sc.share_tokens;
  spec.split = sc.split;
  spec.Hq = 4, spec.Hkv = 2, spec.D = 40, spec.Dv = 24, spec.page_size = 8;
  spec.sinks = variant == 1;
  spec.soft_cap = variant == 1 ? std::optional<double>(10.0) : std::nullopt;
  if (variant == 2) spec.dtype = DType::bf16, spec.kv_dtype = DType::i8;
  if (variant == 3) spec.kv_dtype = DType::fp8_e4m3, spec.scales = KVScales::per_tensor;
  SCOPED_TRACE(std::string(sc.name) + ": " + spec.describe());
  const PagedCase c = make_paged_case(spec);

  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, spec.Hq, c.options);
  if (sc.expect_shared_keys >= 0) {
    EXPECT_EQ(plan.shared_keys(), sc.expect_shared_keys);
  }
  if (sc.expect_shared_keys != 0) {
    EXPECT_GT(plan.shared_keys(), 0);
    i64 shared_items = 0;
    for (const PagedWorkItem& it : plan.work())
      if (it.kind == PagedWorkKind::shared) {
        ++shared_items;
        EXPECT_GE(it.member_count, 2);
      }
    EXPECT_GT(shared_items, 0);
  }
  PagedAttentionOptions off = c.options;
  off.share_prefixes = false;
  EXPECT_EQ(plan_paged(c.batch, c.cache.spec(), c.N, spec.Hq, off).shared_keys(), 0);

  for (cpu::Isa tier : cpu_tiers_to_test()) {
    SCOPED_TRACE(tier_label(tier));
    const AttentionOutput ref = run_tier(c, c.batch, c.q, false, tier, 1);
    for (int threads : {1, 2, 3}) {
      const AttentionOutput on = run_tier(c, c.batch, c.q, true, tier, threads);
      EXPECT_EQ(on.decision.run.shared_keys, plan.shared_keys());
      EXPECT_TRUE(same_bits(on.out, ref.out)) << "threads " << threads;
      EXPECT_TRUE(same_bits(*on.lse, *ref.lse)) << "threads " << threads;
    }
    for (std::size_t s = 0; s < spec.q_lens.size(); ++s) {
      const SubBatch one = alone(c, s);
      const Tensor q =
          Tensor::copy_of(TensorView(q_of(c, s).data(), spec.dtype, {spec.q_lens[s], spec.Hq, spec.D}));
      const AttentionOutput a = run_tier(c, one.batch, q, true, tier, 2);
      EXPECT_TRUE(same_rows(ref, c.q_begin(s), a, 0, spec.q_lens[s], spec.Hq, spec.Dv)) << "sequence " << s;
    }
  }
  // Against the oracle too (the shared path computes what the unshared one does).
  const AttentionOutput cpu = run_paged(c, Backend::cpu);
  const Tolerance tol = tolerance_for(spec.dtype);
  for (std::size_t s = 0; s < spec.q_lens.size(); ++s)
    EXPECT_TRUE(rows_match(c, s, cpu, dense_oracle(c, s), tol.out, tol.lse));
  if (plan.shared_keys() > 0) {
    EXPECT_THAT(cpu.decision.to_json(), HasSubstr("\"shared_keys\": "));
  }
}

INSTANTIATE_TEST_SUITE_P(Paged, SharedPrefix,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(share_cases().size())),
                                            ::testing::Range(0, 4)));

// A group longer than one shared item holds (kMaxMembers) is cut into several items, each read once.
TEST(SharedPrefixPlan, LongGroupsBecomeSeveralItemsAndNothingIsSharedAcrossDifferentPages) {
  PagedCaseSpec spec;
  for (int s = 0; s < 40; ++s) {
    spec.q_lens.push_back(1);
    spec.kv_lens.push_back(70 + s);
    spec.share_from.push_back(s == 0 ? -1 : 0);
    spec.share_tokens.push_back(s == 0 ? 0 : 64);
  }
  spec.split = 32;
  spec.page_size = 16;
  const PagedCase c = make_paged_case(spec);
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, spec.Hq, c.options);
  i64 members = 0, items = 0;
  for (const PagedWorkItem& it : plan.work())
    if (it.kind == PagedWorkKind::shared) {
      ++items, members += it.member_count;
      EXPECT_LE(it.member_count, 17);
      for (i64 m = 0; m < it.member_count; ++m)
        EXPECT_EQ(plan.members()[static_cast<std::size_t>(it.member_begin + m)].split, it.kv_begin / 32);
    }
  EXPECT_EQ(members, 80);  // 40 sequences x 2 splits
  EXPECT_EQ(items, 6);     // 16 + 16 + 8 per split
  EXPECT_EQ(plan.shared_keys(), 6 * 32);
}

}  // namespace
}  // namespace attnops::testing
