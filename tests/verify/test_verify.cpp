// Tests of the differential fuzzer itself (verify/): the generator reaches the kernels' edge
// sizes, a case is reproduced bit for bit from SEED:CASE, a wrong result from an operator is
// reported (with its replay command) and replays, and the shrinker returns a smaller failing case.
// Paged: 8-bit caches of both dtypes and scale kinds and plans with and without shared prefixes
// are drawn, their codes and scales are what the cache holds, and a kernel that mis-scales one
// token of an 8-bit cache is reported.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/operation.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "verify/dense_problem.h"
#include "verify/edges.h"
#include "verify/fuzz.h"
#include "verify/paged_problem.h"
#include "verify/shrink.h"

namespace attnops::verify {
namespace {

// ---- the generator ------------------------------------------------------------------------------

TEST(VerifyEdges, EveryEdgeAndItsNeighboursIsDrawnOften) {
  // Each edge e of an axis, and e - 1 and e + 1, come up far more often than a log-uniform draw
  // over the range would give them (about 20000 / (e ln 4096) times in 20000 draws: 37 for e = 64),
  // and most draws sit on an edge or next to one.
  const ShapeContext ctx{};
  for (unsigned axis : {kSeqQ, kSeqK, kHeadDim, kBlock, kPage, kSplit, kKv8}) {
    std::int64_t hi = axis == kHeadDim || axis == kKv8 ? 256 : 4096;
    Rng rng(1234 + axis);
    std::map<std::int64_t, int> seen;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ++seen[draw_size(rng, axis, ctx, axis == kSeqQ || axis == kSeqK ? 0 : 1, hi)];
    const std::vector<std::int64_t> near = edge_values(axis, ctx, 0, hi);
    int on_edge = 0;
    for (std::int64_t x : near) on_edge += seen[x];
    EXPECT_GT(on_edge, n * 6 / 10) << "axis " << axis;
    for (const Edge& e : edge_table()) {
      if (!(e.axes & axis)) continue;
      for (std::int64_t x : {e.value - 1, e.value, e.value + 1}) {
        if (x < 1 || x > hi) continue;
        EXPECT_GE(seen[x], e.value >= 64 ? 60 : 1) << "axis " << axis << ": " << e.name << " " << x;
      }
    }
  }
}

TEST(VerifyEdges, DenseProblemsReachTheKernelsEdges) {
  // Over many cases: Tk at and around the key block (256), the tiled block (128), the paged
  // split (512); Tq around vanilla's q chunk; and the shape of the vanilla scratch bug: q-row
  // tails after a whole chunk (a narrow task) with more than one key block and several
  // (batch, kv head) pairs, so a wide task follows the narrow one on the same thread.
  Limits limits;
  std::set<std::int64_t> tk, tq;
  int narrow_then_wide = 0, gqa = 0, strided = 0, nonfinite = 0, masked = 0;
  const int n = 3000;
  for (int i = 0; i < n; ++i) {
    const DenseSpec s = draw_dense(11, static_cast<std::uint64_t>(i), limits);
    EXPECT_LE(s.work(), limits.max_work);
    tk.insert(s.Tk);
    tq.insert(s.Tq);
    const std::int64_t G = s.Hq / s.Hkv, qc = std::max<std::int64_t>(16, 128 / G);
    if (s.Tq > qc && s.Tq % qc != 0 && s.Tk > 256 && s.B * s.Hkv >= 2) ++narrow_then_wide;
    gqa += G > 1;
    strided += s.layout[0].strided || s.layout[1].strided || s.layout[2].strided;
    nonfinite += !s.nonfinite.empty();
    masked += s.mask.has_value();
  }
  for (std::int64_t x : {127, 128, 129, 255, 256, 257, 511, 512, 513, 31, 32, 33, 0, 1})
    EXPECT_TRUE(tk.count(x)) << "Tk " << x << " never drawn";
  for (std::int64_t x : {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 127, 128, 129})
    EXPECT_TRUE(tq.count(x)) << "Tq " << x << " never drawn";
  EXPECT_GT(narrow_then_wide, n / 100) << "narrow-then-wide vanilla tasks over > 256 keys";
  EXPECT_GT(gqa, n / 5);
  EXPECT_GT(strided, n / 10);
  EXPECT_GT(nonfinite, n / 20);
  EXPECT_GT(masked, n / 10);
}

TEST(VerifyReplay, ACaseIsReproducedBitForBitFromSeedAndCase) {
  Limits limits;
  const DenseSpec a = draw_dense(7, 123, limits);
  for (std::uint64_t i = 0; i < 50; ++i) (void)materialize(draw_dense(7, i, limits));  // other cases first
  const DenseSpec b = draw_dense(7, 123, limits);
  EXPECT_EQ(a.describe(), b.describe());
  const DenseInputs x = materialize(a), y = materialize(b);
  for (std::size_t t = 0; t < 3; ++t) {
    ASSERT_EQ(x.qkv[t].storage.nbytes(), y.qkv[t].storage.nbytes());
    EXPECT_EQ(0, std::memcmp(x.qkv[t].storage.data(), y.qkv[t].storage.data(), x.qkv[t].storage.nbytes()));
  }
  EXPECT_EQ(0, std::memcmp(x.dout.data(), y.dout.data(), x.dout.nbytes()));
  // Another case differs.
  EXPECT_NE(draw_dense(7, 124, limits).describe(), a.describe());
  const PagedSpec p = draw_paged(7, 5, limits), p2 = draw_paged(7, 5, limits);
  EXPECT_EQ(p.describe(), p2.describe());
  const PagedInputs pi = materialize(p), pj = materialize(p2);
  EXPECT_EQ(0, std::memcmp(pi.q.data(), pj.q.data(), pi.q.nbytes()));
  EXPECT_EQ(
      0, std::memcmp(pi.pools[0].storage.data(), pj.pools[0].storage.data(), pi.pools[0].storage.nbytes()));
}

// ---- a wrong result is found ----------------------------------------------------------------------

// flash_attn2 whose cpu forward adds 0.5 to one element when the problem has at least 40 keys:
// an operator bug as the fuzzer sees one, through a Registry.
class Perturbed : public OperationImpl {
 public:
  explicit Perturbed(std::shared_ptr<OperationImpl> inner)
      : OperationImpl(inner->metadata()), inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::vector<std::string> aliases() const override { return inner_->aliases(); }
  bool implements(Backend b) const override { return inner_->implements(b); }
  std::optional<Reason> check_inputs(Backend b, const AttentionProblem& p) const override {
    return inner_->check_inputs(b, p);
  }
  AttentionOutput forward_native(const AttentionProblem& p) override { return inner_->forward_native(p); }
  AttentionOutput forward_cpu(const AttentionProblem& p) override {
    AttentionOutput o = inner_->forward_cpu(p);
    const std::size_t last = static_cast<std::size_t>(o.out.numel()) / 2;
    if (p.Tk >= 40 && o.out.numel() > 0) o.out.set(last, o.out.at(last) + 0.5f);
    return o;
  }
  bool implements_backward(Backend b) const override { return inner_->implements_backward(b); }
  std::optional<Reason> check_backward_inputs(Backend b, const BackwardProblem& p) const override {
    return inner_->check_backward_inputs(b, p);
  }
  AttentionGradients backward_native(const BackwardProblem& p) override { return inner_->backward_native(p); }
  AttentionGradients backward_cpu(const BackwardProblem& p) override { return inner_->backward_cpu(p); }

 private:
  std::shared_ptr<OperationImpl> inner_;
};

FuzzOptions small_run(Registry* reg) {
  FuzzOptions o;
  o.seeds = {3};
  o.problems = 12;
  o.request.ops = {"flash_attn2"};
  o.request.passes = {Pass::forward};
  o.request.backends = {Backend::cpu};
  o.request.tiers = {"baseline"};
  o.request.threads = {1};
  o.limits.max_work = 1 << 18;
  o.limits.max_seq = 600;
  o.registry = reg;
  o.shrink = false;
  o.progress_seconds = 0;
  return o;
}

TEST(VerifyFuzz, AWrongResultIsReportedWithItsReplayLineAndReplays) {
  Registry honest;
  register_builtin_operators(honest);
  const FuzzSummary clean = run_fuzz(small_run(&honest));
  EXPECT_EQ(clean.exit_status(), 0) << (clean.failures.empty() ? "" : clean.failures[0].line);
  EXPECT_EQ(clean.problems, 12);
  EXPECT_GT(clean.tally.calls, 0);

  Registry reg;
  register_builtin_operators(reg);
  OperationEntry e = reg.entry("flash_attn2");
  const OperationFactory inner = e.make;
  e.make = [inner](const OperationMetadata& md) { return std::make_shared<Perturbed>(inner(md)); };
  reg.add(e);
  const FuzzSummary s = run_fuzz(small_run(&reg));
  ASSERT_EQ(s.exit_status(), 1);
  const FuzzFailure& f = s.failures.front();
  EXPECT_EQ(f.finding.target.op, "flash_attn2");
  EXPECT_EQ(f.finding.mismatch.what, "out");
  EXPECT_NE(
      f.line.find("MISMATCH seed=3 case=" + std::to_string(f.index) + " flash_attn2 forward cpu baseline"),
      std::string::npos)
      << f.line;
  EXPECT_NE(f.line.find("replay: attnops verify --replay 3:" + std::to_string(f.index) +
                        " --ops flash_attn2 --passes forward --backends cpu --tiers baseline --threads 1"),
            std::string::npos)
      << f.line;
  // Only cases with at least 40 keys fail (the perturbation's condition).
  for (const FuzzFailure& g : s.failures) {
    const std::size_t at = g.finding.problem.find(" Tk=");
    ASSERT_NE(at, std::string::npos);
    EXPECT_GE(std::stoll(g.finding.problem.substr(at + 4)), 40) << g.line;
  }

  // Replay: the same case alone gives the same finding, to the digit.
  FuzzOptions r = small_run(&reg);
  r.replay = std::make_pair(f.seed, f.index);
  const FuzzSummary again = run_fuzz(r);
  ASSERT_FALSE(again.failures.empty());
  EXPECT_EQ(again.failures.front().finding.mismatch.where, f.finding.mismatch.where);
  EXPECT_EQ(again.failures.front().finding.problem, f.finding.problem);
}

// ---- paged: 8-bit caches and shared prefixes -------------------------------------------------------

TEST(VerifyPaged, EightBitCachesAndSharingAreDrawnBothWays) {
  // Over many cases: both 8-bit dtypes with both scale kinds (a third of the caches), scale edges,
  // e4m3 NaN codes, plans with share_prefixes on and off, cases run both ways, and plans that do
  // share keys.
  Limits limits;
  std::map<std::string, int> kinds;
  int kv8 = 0, edges = 0, nan_codes = 0, on = 0, off = 0, both = 0, shared_plans = 0, d16 = 0;
  const int n = 900;
  for (int i = 0; i < n; ++i) {
    const PagedSpec s = draw_paged(21, static_cast<std::uint64_t>(i), limits);
    EXPECT_LE(s.work(), limits.max_work);
    (s.share_prefixes ? on : off) += 1;
    both += s.both_ways;
    if (s.kv8) {
      ++kv8;
      ++kinds[std::string(dtype_name(*s.kv8)) + "/" + std::string(kv_scales_name(s.kv_scales))];
      edges += s.scale_edges;
      for (const Injection& j : s.nonfinite)
        nan_codes += *s.kv8 == DType::fp8_e4m3 && (j.tensor == 'k' || j.tensor == 'v');
      d16 += s.D >= 15 && s.D <= 17;
    }
    if (s.shared_prefix && i % 3 == 0) {
      const PagedInputs in = materialize(s);
      try {
        shared_plans += plan_paged(in.batch, in.cache.spec(), s.rows(), s.Hq, in.options).shared_keys() > 0;
      } catch (const Error&) {
      }
    }
  }
  EXPECT_GT(kv8, n / 4);
  EXPECT_LT(kv8, n * 42 / 100);
  for (const char* k : {"int8/per_token", "int8/per_tensor", "fp8_e4m3/per_token", "fp8_e4m3/per_tensor"})
    EXPECT_GT(kinds[k], n / 40) << k;
  EXPECT_GT(edges, n / 40);
  EXPECT_GT(nan_codes, 3);
  EXPECT_GT(d16, 5);
  EXPECT_GT(on, n / 2);
  EXPECT_GT(off, n / 5);
  EXPECT_GT(both, n / 10);
  EXPECT_GT(shared_plans, 5);
}

// The first case of seed 21 whose cache is 8-bit of kind (t, k).
// (Over 200 cases at most: none there is a failure of the draw.)
std::optional<PagedSpec> first_kv8(DType t, KVScales k) {
  for (std::uint64_t i = 0; i < 200; ++i) {
    const PagedSpec s = draw_paged(21, i, Limits{});
    if (s.kv8 == t && s.kv_scales == k) return s;
  }
  ADD_FAILURE() << "no " << dtype_name(t) << " " << kv_scales_name(k) << " cache in 200 cases";
  return std::nullopt;
}

TEST(VerifyPaged, EightBitCasesAreMaterialisedFromTheSpecAloneAndTheCacheHoldsThem) {
  for (DType t : {DType::i8, DType::fp8_e4m3})
    for (KVScales k : {KVScales::per_token, KVScales::per_tensor}) {
      const std::optional<PagedSpec> found = first_kv8(t, k);
      if (!found) continue;
      const PagedSpec& s = *found;
      SCOPED_TRACE(s.describe());
      const PagedInputs a = materialize(s);
      for (std::uint64_t i = 0; i < 20; ++i) (void)materialize(draw_paged(21, i, Limits{}));
      const PagedInputs b = materialize(draw_paged(21, s.index, Limits{}));
      EXPECT_EQ(a.k_codes, b.k_codes);
      EXPECT_EQ(a.v_codes, b.v_codes);
      EXPECT_EQ(a.k_scales, b.k_scales);
      EXPECT_EQ(a.v_scales, b.v_scales);
      ASSERT_EQ(a.cache.spec().dtype, t);
      ASSERT_EQ(a.cache.spec().scales, k);
      // What the library reads back (gather: code x scale) is code_value x scale of the codes
      // and scales drawn, through the sequence's pages.
      for (std::size_t q = 0; q < s.seqs.size(); ++q) {
        const std::int64_t kl = s.seqs[q].kv_len;
        if (kl == 0) continue;
        Tensor row(DType::i64, {static_cast<std::int64_t>(a.pages[q].size())});
        for (std::size_t j = 0; j < a.pages[q].size(); ++j) row.data_as<std::int64_t>()[j] = a.pages[q][j];
        const PagedKVCache::Dense d = a.cache.gather(row, kl);
        for (std::int64_t j = 0; j < kl; ++j)
          for (std::int64_t h = 0; h < s.Hkv; ++h) {
            const std::int64_t token =
                (a.pages[q][static_cast<std::size_t>(j / s.page_size)] * s.page_size + j % s.page_size) *
                    s.Hkv +
                h;
            const float sc = a.k_scales[static_cast<std::size_t>(k == KVScales::per_token ? token : 0)];
            for (std::int64_t e = 0; e < s.D; ++e) {
              const float want = code_value(t, a.k_codes[static_cast<std::size_t>(token * s.D + e)]) * sc;
              const float got = d.k.data_as<float>()[(j * s.Hkv + h) * s.D + e];
              ASSERT_TRUE(std::memcmp(&want, &got, 4) == 0 || (std::isnan(want) && std::isnan(got)))
                  << "seq " << q << " key " << j << " head " << h << " element " << e << ": " << got << " vs "
                  << want;
            }
          }
        break;
      }
    }
}

// ragged_paged whose cpu kernel reads one token of an 8-bit per-token cache with twice its scale
// (key 0 of the first sequence with keys, every kv head): a quantised-cache bug as the fuzzer
// sees one, through a Registry.
class MisScaled : public OperationImpl {
 public:
  explicit MisScaled(std::shared_ptr<OperationImpl> inner)
      : OperationImpl(inner->metadata()), inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::vector<std::string> aliases() const override { return inner_->aliases(); }
  bool implements(Backend b) const override { return inner_->implements(b); }
  AttentionOutput forward_native(const AttentionProblem& p) override { return inner_->forward_native(p); }
  bool implements_paged(Backend b) const override { return inner_->implements_paged(b); }
  std::optional<Reason> check_paged_inputs(Backend b, const PagedProblem& p) const override {
    return inner_->check_paged_inputs(b, p);
  }
  AttentionOutput paged_native(const PagedProblem& p) override { return inner_->paged_native(p); }
  AttentionOutput paged_cpu(const PagedProblem& p) override {
    if (!p.per_token_scales()) return inner_->paged_cpu(p);
    PagedProblem q = p;
    Tensor ks = Tensor::copy_of(p.k_scales);
    for (std::int64_t s = 0; s < p.plan.num_seqs(); ++s)
      if (p.plan.kv_len(s) > 0) {
        const std::int64_t page = p.plan.pages(s)[0];
        for (std::int64_t h = 0; h < p.Hkv; ++h) {
          const std::size_t at = static_cast<std::size_t>((page * p.page_size) * p.Hkv + h);
          ks.set(at, ks.at(at) * 2);
        }
        break;
      }
    q.k_scales = ks.view();
    q.owned.push_back(ks);
    return inner_->paged_cpu(q);
  }

 private:
  std::shared_ptr<OperationImpl> inner_;
};

FuzzOptions paged_run(Registry* reg) {
  FuzzOptions o;
  o.seeds = {21};
  o.problems = 150;
  o.request.ops = {"ragged_paged"};
  o.request.passes = {Pass::forward};
  o.request.backends = {Backend::cpu};
  o.request.tiers = {"baseline"};
  o.request.threads = {1};
  o.limits.max_work = 1 << 18;
  o.limits.max_seq = 600;
  o.registry = reg;
  o.shrink = false;
  o.progress_seconds = 0;
  return o;
}

TEST(VerifyPaged, AKernelThatMisScalesOneTokenIsFound) {
  Registry honest;
  register_builtin_operators(honest);
  const FuzzSummary clean = run_fuzz(paged_run(&honest));
  EXPECT_EQ(clean.exit_status(), 0) << (clean.failures.empty() ? "" : clean.failures[0].line);
  bool kv8_calls = false, shared_calls = false;
  for (const auto& [k, n] : clean.tally.calls_by_target) {
    kv8_calls = kv8_calls || k.find("per_token cache") != std::string::npos;
    shared_calls = shared_calls || k.find("shared prefixes") != std::string::npos;
  }
  EXPECT_TRUE(kv8_calls);
  EXPECT_TRUE(shared_calls);

  Registry reg;
  register_builtin_operators(reg);
  OperationEntry e = reg.entry("ragged_paged");
  const OperationFactory inner = e.make;
  e.make = [inner](const OperationMetadata& md) { return std::make_shared<MisScaled>(inner(md)); };
  reg.add(e);
  const FuzzSummary s = run_fuzz(paged_run(&reg));
  ASSERT_EQ(s.exit_status(), 1);
  for (const FuzzFailure& f : s.failures) {
    EXPECT_NE(f.finding.problem.find("/per_token"), std::string::npos) << f.line;
    EXPECT_NE(f.line.find("ragged_paged forward cpu baseline"), std::string::npos) << f.line;
  }
  // Replay: the same case alone gives the same finding.
  const FuzzFailure& f = s.failures.front();
  FuzzOptions r = paged_run(&reg);
  r.replay = std::make_pair(f.seed, f.index);
  const FuzzSummary again = run_fuzz(r);
  ASSERT_FALSE(again.failures.empty());
  EXPECT_EQ(again.failures.front().finding.problem, f.finding.problem);
  EXPECT_EQ(again.failures.front().finding.mismatch.where, f.finding.mismatch.where);
}

TEST(VerifyPaged, ASavedEightBitCaseHoldsItsCodesScalesAndFlags) {
  for (DType t : {DType::i8, DType::fp8_e4m3})
    for (KVScales k : {KVScales::per_token, KVScales::per_tensor}) {
      const std::optional<PagedSpec> found = first_kv8(t, k);
      if (!found) continue;
      const PagedSpec& s = *found;
      std::map<std::string, Tensor> saved;
      Target tg;
      tg.op = "ragged_paged";
      tg.kernel = "baseline";
      const std::string cmd = save_paged_case(s, tg, "d", [&](const std::string& path, const TensorView& v) {
        saved[path] = Tensor::copy_of(v);
      });
      EXPECT_NE(cmd.find(" --kv-dtype " + std::string(dtype_name(t)) +
                         " --k-scales d/k_scales.npy --v-scales "
                         "d/v_scales.npy"),
                std::string::npos)
          << cmd;
      EXPECT_EQ(cmd.find("--no-share-prefixes") == std::string::npos, s.share_prefixes) << cmd;
      const PagedInputs in = materialize(s);
      ASSERT_EQ(saved["d/k_pages.npy"].dtype(), t);
      ASSERT_EQ(saved["d/k_scales.npy"].dtype(), DType::f32);
      // The codes and scales in logical order, as drawn.
      const Tensor& kp = saved["d/k_pages.npy"];
      ASSERT_EQ(static_cast<std::size_t>(kp.numel()), in.k_codes.size());
      EXPECT_EQ(0, std::memcmp(kp.data(), in.k_codes.data(), in.k_codes.size()));
      const Tensor& vs = saved["d/v_scales.npy"];
      ASSERT_EQ(static_cast<std::size_t>(vs.numel()), in.v_scales.size());
      EXPECT_EQ(0, std::memcmp(vs.data(), in.v_scales.data(), 4 * in.v_scales.size()));
    }
}

// ---- the shrinker ---------------------------------------------------------------------------------

TEST(VerifyShrink, FindsTheSmallestFailingSizes) {
  DenseSpec s = draw_dense(5, 1, Limits{});
  s = with_shape(s, 3, 200, 300, 8, 4, 48, 40);
  // Fails while Tk >= 37, Hq >= 2 and Tq >= 5.
  const auto fails = [](const DenseSpec& x) { return x.Tk >= 37 && x.Hq >= 2 && x.Tq >= 5; };
  const ShrinkResult r = shrink_dense(s, fails, ShrinkBudget{1000, 60});
  ASSERT_TRUE(r.smaller);
  EXPECT_EQ(r.spec.Tk, 37);
  EXPECT_EQ(r.spec.Tq, 5);
  EXPECT_EQ(r.spec.Hq, 2);
  EXPECT_EQ(r.spec.B, 1);
  EXPECT_EQ(r.spec.Hkv, 1);
  EXPECT_EQ(r.spec.D, 1);
  EXPECT_EQ(r.spec.Dv, 1);
  // A budget of tries is kept, and a case that never fails smaller stays as it was.
  EXPECT_LE(shrink_dense(s, fails, ShrinkBudget{3, 60}).tries, 3);
  const ShrinkResult none = shrink_dense(s, [&](const DenseSpec& x) { return x.Tk == 300 && x.B == 3; }, {});
  EXPECT_EQ(none.spec.Tk, 300);
}

TEST(VerifyShrink, AFailingOperatorCaseShrinksThroughTheFuzzer) {
  Registry reg;
  register_builtin_operators(reg);
  OperationEntry e = reg.entry("flash_attn2");
  const OperationFactory inner = e.make;
  e.make = [inner](const OperationMetadata& md) { return std::make_shared<Perturbed>(inner(md)); };
  reg.add(e);
  FuzzOptions o = small_run(&reg);
  o.shrink = true;
  o.shrink_budget = {60, 60};
  const FuzzSummary s = run_fuzz(o);
  ASSERT_FALSE(s.failures.empty());
  bool shrunk = false;
  for (const FuzzFailure& f : s.failures) shrunk = shrunk || !f.smallest.empty();
  ASSERT_TRUE(shrunk);
  for (const FuzzFailure& f : s.failures)
    if (!f.smallest.empty()) {
      EXPECT_NE(f.smallest.find("--shape "), std::string::npos) << f.smallest;
    }
}

}  // namespace
}  // namespace attnops::verify
