// The backward's non-finite policy (README, "Gradients"): a masked pair (i, j) — excluded by the
// static mask, by segment ids, or by a logit of -inf — contributes nothing to dq_i, dk_j, dv_j,
// dbias_ij or dsinks, even when q_i, k_j, v_j or dout_i hold NaN or inf; visible pairs follow
// IEEE arithmetic; a row whose forward output is NaN has NaN gradients wherever that arithmetic
// puts them; a fully masked row has zero dq and contributes nothing.
//
// Grid: every operator x {native, cpu, gpu} x {causal, sliding window, chunked, segments, -inf
// bias} x a NaN or +inf planted in one element of dout, q, k or v, at a row / key that only
// masked pairs touch (a fully masked row, a key no row sees) and at one that some rows see and
// others do not. GQA (Hq 2, Hkv 1), sinks and (for the bias case) dbias on every call. Each cell
// is checked against the policy in words, computed here from the inputs in fp64:
//  - every gradient entry that no visible pair links to a poisoned value is finite, and equal
//    to the native backward's within the f32 tolerance;
//  - entries no visible pair reaches at all are exactly 0 (fully masked rows' dq, unseen keys'
//    dk / dv, masked dbias entries);
//  - a NaN-output row (a visible logit NaN or +inf) has NaN dq, NaN dk / dv for every key it
//    sees, NaN visible dbias entries and a NaN dsinks for its head;
//  - cpu (and gpu) cells have the native cell's class (NaN, +inf, -inf, finite) in every element.
// Before this test, cpu leaked NaN into rows and keys that cannot see it (every mask kind) and
// native leaked through -inf logits and returned zeros for NaN-output rows.
//
// The gpu cells run on lavapipe (or any Vulkan device); without a device they skip, saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::int64_t kHq = 2, kHkv = 1, kD = 12, kPoisonDim = 3;
constexpr double kTol = 4e-5;  // f32 gradients against the fp64 oracle (tests/backward/grad_testing.h)

// One mask kind: its shape and options; the rows / keys to poison are found from the masks.
struct MaskKind {
  const char* name;
  std::int64_t Tq, Tk;
  std::function<void(AttentionOptions&)> options;
  bool segments = false, bias = false;
};

const MaskKind kMasks[] = {
    // Tq > Tk: rows 0..3 see no key (bottom-right alignment), every key is seen.
    {"causal", 24, 20, [](AttentionOptions& o) { o.causal = true; }},
    // Keys 0..12 are seen by no row.
    {"window", 24, 40,
     [](AttentionOptions& o) {
       o.causal = false;
       o.sliding_window = Window{3, 2};
     }},
    // Chunks of 8: keys 0..15 are in chunks no row reaches.
    {"chunked", 24, 40,
     [](AttentionOptions& o) {
       o.causal = true;
       o.chunk_size = 8;
     }},
    // q segment 5 has no key (rows 16..23 fully masked), kv segment 7 no row (keys 26..39).
    {"segments", 24, 40, [](AttentionOptions& o) { o.causal = false; }, true},
    // Column 5 is -inf for every row, row 3 of head 0 everywhere; scattered -inf entries.
    {"neg_inf_bias", 24, 40, [](AttentionOptions& o) { o.causal = false; }, false, true},
};

// What is poisoned: one element of a row of q / dout ((i, h)) or of k / v (key j, kv head 0).
enum class Where { dout, q, k, v };
const char* where_name(Where w) {
  return w == Where::dout ? "dout" : w == Where::q ? "q" : w == Where::k ? "k" : "v";
}

struct GradCase {
  std::int64_t Tq, Tk;
  Tensor q, k, v, dout, sinks;
  std::optional<Tensor> seg_q, seg_kv, bias;
  AttentionOptions opts;  // views the tensors above

  explicit GradCase(const MaskKind& m)
      : Tq(m.Tq),
        Tk(m.Tk),
        q(random_tensor(DType::f32, {1, m.Tq, kHq, kD}, 1)),
        k(random_tensor(DType::f32, {1, m.Tk, kHkv, kD}, 2)),
        v(random_tensor(DType::f32, {1, m.Tk, kHkv, kD}, 3)),
        dout(random_tensor(DType::f32, {1, m.Tq, kHq, kD}, 4)),
        sinks(DType::f32, {kHq}) {
    m.options(opts);
    sinks.set(0, 0.25f);
    sinks.set(1, -0.5f);
    opts.sinks = sinks.view();
    if (m.segments) {
      seg_q.emplace(DType::i32, std::vector<std::int64_t>{1, Tq});
      seg_kv.emplace(DType::i32, std::vector<std::int64_t>{1, Tk});
      for (std::int64_t i = 0; i < Tq; ++i) seg_q->data_as<std::int32_t>()[i] = i < 8 ? 0 : i < 16 ? 1 : 5;
      for (std::int64_t j = 0; j < Tk; ++j) seg_kv->data_as<std::int32_t>()[j] = j < 12 ? 0 : j < 26 ? 1 : 7;
      opts.segment_ids_q = seg_q->view();
      opts.segment_ids_kv = seg_kv->view();
    }
    if (m.bias) {
      bias.emplace(random_tensor(DType::f32, {1, kHq, Tq, Tk}, 5));
      for (std::int64_t h = 0; h < kHq; ++h)
        for (std::int64_t i = 0; i < Tq; ++i)
          for (std::int64_t j = 0; j < Tk; ++j)
            if (j == 5 || (h == 0 && i == 3) || (i + 2 * j) % 7 == 0)
              bias->set(static_cast<std::size_t>((h * Tq + i) * Tk + j), -kInf);
      opts.bias = bias->view();
    }
  }
  Tensor& tensor(Where w) { return w == Where::dout ? dout : w == Where::q ? q : w == Where::k ? k : v; }
};

std::size_t row_at(std::int64_t i, std::int64_t h, std::int64_t H, std::int64_t d) {
  return static_cast<std::size_t>((i * H + h) * kD + d);  // B = 1, [T, H, D]
}

// The policy in fp64, from the (poisoned) inputs: which pairs are masked, which rows are NaN rows,
// which gradient entries a poisoned value may reach (through visible pairs only), which must be
// exactly zero and which must be NaN.
struct Expectation {
  std::int64_t Tq = 0, Tk = 0;
  std::vector<char> dq_taint, dk_taint, dv_taint, dbias_taint, dsinks_taint;  // per row / key / pair / head
  std::vector<char> dq_zero, dkv_zero, dbias_zero;
  std::vector<char> dq_nan, dkv_nan, dbias_nan, dsinks_nan;
};

bool finite_row(const Tensor& t, std::int64_t i, std::int64_t h, std::int64_t H) {
  for (std::int64_t d = 0; d < kD; ++d)
    if (!std::isfinite(t.at(row_at(i, h, H, d)))) return false;
  return true;
}

Expectation expect_policy(const GradCase& c) {
  const AttentionProblem p = make_problem(c.q, c.k, c.v, c.opts, {});
  const std::int64_t Tq = c.Tq, Tk = c.Tk;
  Expectation e;
  e.Tq = Tq, e.Tk = Tk;
  const auto pairs = static_cast<std::size_t>(kHq * Tq * Tk);
  e.dq_taint.assign(static_cast<std::size_t>(Tq * kHq), 0);
  e.dk_taint.assign(static_cast<std::size_t>(Tk), 0);
  e.dv_taint.assign(static_cast<std::size_t>(Tk), 0);
  e.dbias_taint.assign(pairs, 0);
  e.dsinks_taint.assign(kHq, 0);
  e.dq_zero.assign(static_cast<std::size_t>(Tq * kHq), 1);
  e.dkv_zero.assign(static_cast<std::size_t>(Tk), 1);
  e.dbias_zero.assign(pairs, 1);
  e.dq_nan.assign(static_cast<std::size_t>(Tq * kHq), 0);
  e.dkv_nan.assign(static_cast<std::size_t>(Tk), 0);
  e.dbias_nan.assign(pairs, 0);
  e.dsinks_nan.assign(kHq, 0);
  std::vector<char> kbad(static_cast<std::size_t>(Tk)), vbad(static_cast<std::size_t>(Tk));
  for (std::int64_t j = 0; j < Tk; ++j) {
    kbad[static_cast<std::size_t>(j)] = !finite_row(c.k, j, 0, kHkv);
    vbad[static_cast<std::size_t>(j)] = !finite_row(c.v, j, 0, kHkv);
  }
  std::vector<double> x(static_cast<std::size_t>(Tk));
  std::vector<char> vis(static_cast<std::size_t>(Tk));
  for (std::int64_t h = 0; h < kHq; ++h)
    for (std::int64_t i = 0; i < Tq; ++i) {
      const bool qbad = !finite_row(c.q, i, h, kHq), gbad = !finite_row(c.dout, i, h, kHq);
      bool nan_row = false, v_reached = false;
      for (std::int64_t j = 0; j < Tk; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        double dot = 0;
        for (std::int64_t d = 0; d < kD; ++d)
          dot += static_cast<double>(c.q.at(row_at(i, h, kHq, d))) * c.k.at(row_at(j, 0, kHkv, d));
        x[uj] = p.scale * dot + (p.bias ? static_cast<double>(p.bias_row(0, h, i)[j]) : 0.0);
        vis[uj] = native::visible(p, 0, h, i, j) && x[uj] != -std::numeric_limits<double>::infinity();
        if (!vis[uj]) continue;
        nan_row = nan_row || std::isnan(x[uj]) || x[uj] == std::numeric_limits<double>::infinity();
        v_reached = v_reached || vbad[uj];
      }
      const auto r = static_cast<std::size_t>(i * kHq + h);
      const bool d_taint = gbad || nan_row || v_reached;  // Delta_i = dout_i . out_i
      for (std::int64_t j = 0; j < Tk; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        if (!vis[uj]) continue;
        const auto pij = static_cast<std::size_t>((h * Tq + i) * Tk + j);
        const bool ds_taint = nan_row || gbad || vbad[uj] || d_taint;  // P, dP, Delta
        e.dq_taint[r] |= ds_taint || kbad[uj];
        e.dk_taint[uj] |= ds_taint || qbad;
        e.dv_taint[uj] |= nan_row || gbad;
        e.dbias_taint[pij] = ds_taint;
        e.dq_zero[r] = 0;
        e.dkv_zero[uj] = 0;
        e.dbias_zero[pij] = 0;
        e.dsinks_taint[static_cast<std::size_t>(h)] |= d_taint;
        if (nan_row) e.dkv_nan[uj] = 1, e.dbias_nan[pij] = 1;
      }
      if (nan_row) e.dq_nan[r] = 1, e.dsinks_nan[static_cast<std::size_t>(h)] = 1;
    }
  return e;
}

// Rows (i, h) and keys j that some pairs see and others do not, and those only masked pairs
// touch (a fully masked row, a key no row sees), from the unpoisoned case.
struct Positions {
  std::vector<std::pair<std::int64_t, std::int64_t>> rows;
  std::vector<std::int64_t> keys;
};
Positions positions_of(const GradCase& c) {
  const Expectation e = expect_policy(c);
  Positions pos;
  std::optional<std::pair<std::int64_t, std::int64_t>> masked_row;
  for (std::int64_t i = 0; i < c.Tq && !masked_row; ++i)
    for (std::int64_t h = 0; h < kHq && !masked_row; ++h)
      if (e.dq_zero[static_cast<std::size_t>(i * kHq + h)]) masked_row = {i, h};
  if (masked_row) pos.rows.push_back(*masked_row);
  pos.rows.push_back({c.Tq - 2, 1});  // sees some keys; other rows do not see all of its keys
  for (std::int64_t j = 0; j < c.Tk; ++j)
    if (e.dkv_zero[static_cast<std::size_t>(j)]) {
      pos.keys.push_back(j);
      break;
    }
  pos.keys.push_back(c.Tk - 4);  // seen by the last rows, masked for some earlier ones
  return pos;
}

std::string where_text(const char* what, std::size_t index) {
  return std::string(what) + "[" + std::to_string(index) + "]";
}

OperationMetadata metadata_for(const std::string& op, Backend b,
                               std::optional<std::int64_t> block = std::nullopt) {
  OperationMetadata md = registry().entry(op).defaults;
  md.backends = {b};
  if (block) md.blocksize_q = md.blocksize_k = *block;
  md.fallbacks = FallbackPolicy{};  // every rule off: the operator's own kernels run
  md.gpu.allow_software = true;     // lavapipe counts here
  md.num_threads =
      1;  // tiny calls: OpenMP regions would cost more than the work (results do not depend on it)
  return md;
}

AttentionGradients run_backward(const std::string& op, Backend b, const GradCase& c,
                                std::optional<std::int64_t> block = std::nullopt) {
  const Attention attn = registry().get(op, metadata_for(op, b, block));
  AttentionOptions o = c.opts;
  o.return_lse = true;
  const AttentionOutput fwd = attn(c.q, c.k, c.v, o);
  EXPECT_EQ(fwd.decision.backend, b);
  AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, c.dout, c.opts);
  EXPECT_EQ(g.decision.backend, b);
  return g;
}

enum class Cls { nan, pos_inf, neg_inf, finite };
Cls classify(double x) {
  if (std::isnan(x)) return Cls::nan;
  if (std::isinf(x)) return x > 0 ? Cls::pos_inf : Cls::neg_inf;
  return Cls::finite;
}

// Checks one gradient tensor, element by element, against the expectation and the native cell.
// `unit(e)` maps element e to its row / key / pair / head index in the expectation's vectors.
void check_tensor(const char* name, const Tensor& got, const Tensor* native, std::int64_t per_unit,
                  const std::vector<char>& taint, const std::vector<char>& zero, const std::vector<char>& nan,
                  const std::function<std::size_t(std::int64_t)>& unit) {
  double scale = 1;
  if (native)
    for (std::int64_t e = 0; e < native->numel(); ++e)
      if (std::isfinite(native->at(static_cast<std::size_t>(e))))
        scale = std::max(scale, static_cast<double>(std::abs(native->at(static_cast<std::size_t>(e)))));
  int reported = 0;
  for (std::int64_t e = 0; e < got.numel() && reported < 5; ++e) {
    const auto ue = static_cast<std::size_t>(e);
    const std::size_t u = unit(e / per_unit);
    const double x = got.at(ue);
    std::string bad;
    if (!taint[u] && !std::isfinite(x))
      bad = "is " + std::to_string(x) + " but no visible pair reaches a poisoned value";
    if (zero[u] && x != 0.0) bad = "is " + std::to_string(x) + " but only masked pairs touch it (must be 0)";
    if (nan[u] && !std::isnan(x))
      bad = "is " + std::to_string(x) + " but belongs to a NaN-output row (must be NaN)";
    if (native && bad.empty()) {
      const double want = native->at(ue);
      if (classify(x) != classify(want))
        bad = "is " + std::to_string(x) + ", native has " + std::to_string(want);
      else if (std::isfinite(want) && std::abs(x - want) > kTol * scale)
        bad = "is " + std::to_string(x) + ", native has " + std::to_string(want) +
              " (beyond the f32 tolerance)";
    }
    if (!bad.empty()) {
      ADD_FAILURE() << where_text(name, ue) << " " << bad;
      ++reported;
    }
  }
}

using Param = std::tuple<std::string, Backend>;
class BackwardNonFinite : public ::testing::TestWithParam<Param> {};

TEST_P(BackwardNonFinite, MaskedPairsContributeNothing) {
  const auto& [op, backend] = GetParam();
  const OperationMetadata md = metadata_for(op, backend);
  if (const Availability a = registry().host().availability(backend, md.gpu); !a.available)
    GTEST_SKIP() << backend_name(backend) << " is not available here: " << a.detail;
  // The default blocks (one partial tile here) and 16 x 16 (full, partial and empty tiles).
  const std::vector<std::optional<std::int64_t>> blocks =
      backend == Backend::native ? std::vector<std::optional<std::int64_t>>{std::nullopt}
                                 : std::vector<std::optional<std::int64_t>>{std::nullopt, 16};
  for (const std::optional<std::int64_t> block : blocks)
    for (const MaskKind& m : kMasks) {
      const Positions pos = positions_of(GradCase(m));
      for (const Where w : {Where::dout, Where::q, Where::k, Where::v})
        for (const float value : {kNaN, kInf}) {
          const std::size_t n = (w == Where::dout || w == Where::q) ? pos.rows.size() : pos.keys.size();
          for (std::size_t at = 0; at < n; ++at) {
            GradCase c(m);
            std::size_t element = 0;
            if (w == Where::dout || w == Where::q)
              element = row_at(pos.rows[at].first, pos.rows[at].second, kHq, kPoisonDim);
            else
              element = row_at(pos.keys[at], 0, kHkv, kPoisonDim);
            c.tensor(w).set(element, value);
            std::ostringstream label;
            label << op << " on " << backend_name(backend) << (block ? ", blocks 16" : "") << ", " << m.name
                  << ": " << value << " in " << where_name(w) << "[" << element << "]";
            SCOPED_TRACE(label.str());
            const Expectation e = expect_policy(c);
            const AttentionGradients g = run_backward(op, backend, c, block);
            std::optional<AttentionGradients> native;
            if (backend != Backend::native) native = run_backward(op, Backend::native, c);
            // dq [1, Tq, Hq, D]: unit (i, h); dk, dv [1, Tk, 1, D]: unit j; dbias [1, Hq, Tq, Tk]:
            // unit (h, i, j); dsinks [Hq]: unit h.
            const auto same = [](std::int64_t u) { return static_cast<std::size_t>(u); };
            check_tensor("dq", g.dq, native ? &native->dq : nullptr, kD, e.dq_taint, e.dq_zero, e.dq_nan,
                         same);
            check_tensor("dk", g.dk, native ? &native->dk : nullptr, kD, e.dk_taint, e.dkv_zero, e.dkv_nan,
                         same);
            check_tensor("dv", g.dv, native ? &native->dv : nullptr, kD, e.dv_taint, e.dkv_zero, e.dkv_nan,
                         same);
            ASSERT_TRUE(g.dsinks.has_value());
            const std::vector<char> no_zero(kHq, 0);
            check_tensor("dsinks", *g.dsinks, native ? &*native->dsinks : nullptr, 1, e.dsinks_taint, no_zero,
                         e.dsinks_nan, same);
            if (m.bias) {
              ASSERT_TRUE(g.dbias.has_value());
              check_tensor("dbias", *g.dbias, native ? &*native->dbias : nullptr, 1, e.dbias_taint,
                           e.dbias_zero, e.dbias_nan, same);
            }
          }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(OperatorsXBackends, BackwardNonFinite,
                         ::testing::Combine(::testing::Values("vanilla", "blocksparse", "flash_attn2"),
                                            ::testing::Values(Backend::native, Backend::cpu, Backend::gpu)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(backend_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace attnops::testing
