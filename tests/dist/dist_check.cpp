#include "tests/dist/dist_check.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "attnops/attnops.h"
#include "attnops/dist/sequence_parallel.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"
#include "tests/support/testing.h"

namespace attnops::dist::testing {

namespace {

std::pair<std::int64_t, std::int64_t> heads(int P, std::int64_t group) {
  return P == 3 ? std::pair<std::int64_t, std::int64_t>{3 * group, 3}
                : std::pair<std::int64_t, std::int64_t>{4, 4 / group};
}

// Max |got - want| over the rows `rows` (global positions) of dimension `dim` of a tensor of
// shape `shape` (got: this rank's shard of those rows, want: the full oracle), and checks.
struct Err {
  double max = 0;
  bool finite_ok = true;  // NaN / inf only where the oracle has -inf (lse)
  std::string where;
};

// Iterates a full tensor's elements whose `dim` index is in `positions` (in shard order).
template <class Fn>
void for_shard(const std::vector<std::int64_t>& shape, int dim, const std::vector<std::int64_t>& positions,
               Fn&& fn) {
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const std::int64_t T = shape[static_cast<std::size_t>(dim)],
                     n = static_cast<std::int64_t>(positions.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t e = 0; e < inner; ++e)
        fn((o * T + positions[static_cast<std::size_t>(i)]) * inner + e, (o * n + i) * inner + e);
}

Err compare(const char* name, const Tensor& got_shard, const std::vector<double>& want,
            const std::vector<std::int64_t>& shape, int dim, const std::vector<std::int64_t>& positions) {
  Err r;
  for_shard(shape, dim, positions, [&](std::int64_t full, std::int64_t part) {
    const double w = want[static_cast<std::size_t>(full)], g = got_shard.at(static_cast<std::size_t>(part));
    if (std::isinf(w) && w < 0) {
      if (!(std::isinf(g) && g < 0)) r.finite_ok = false, r.where = std::string(name) + ": -inf expected";
      return;
    }
    if (!std::isfinite(g)) {
      r.finite_ok = false;
      r.where = std::string(name) + ": non-finite " + std::to_string(g) + " where the oracle has " +
                std::to_string(w);
      return;
    }
    r.max = std::max(r.max, std::abs(g - w));
  });
  return r;
}

double scale_of(const std::vector<double>& v) {
  double s = 1;
  for (double x : v)
    if (std::isfinite(x)) s = std::max(s, std::abs(x));
  return s;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

std::vector<std::int64_t> positions_of(const ShardLayout& l, int rank) {
  std::vector<std::int64_t> v;
  for (const Chunk& c : l.chunks(rank))
    for (std::int64_t i = c.begin; i < c.end; ++i) v.push_back(i);
  return v;
}

}  // namespace

std::vector<DistCase> matrix(int P) {
  std::vector<DistCase> v;
  auto add = [&](std::string name, std::int64_t group, auto&& set) {
    DistCase c;
    c.name = std::move(name);
    std::tie(c.Hq, c.Hkv) = heads(P, group);
    set(c);
    v.push_back(c);
  };
  // Lengths are odd: never divisible by 2P.
  add("non_causal", 1, [](DistCase& c) { c.causal = false; });
  add("causal_zigzag_gqa2", 2, [](DistCase& c) { c.Tq = c.Tk = 61; });
  add("causal_contiguous_gqa4", 4, [](DistCase& c) { c.layout = Layout::contiguous; });
  add("sliding_window_causal", 1, [](DistCase& c) {
    c.window = Window{6, 0};
    c.Tq = c.Tk = 67;
  });
  add("sliding_window_two_sided", 2, [](DistCase& c) {
    c.causal = false;
    c.window = Window{5, 3};
  });
  add("chunked_causal", 1, [](DistCase& c) { c.chunk = 10; });
  add("segments_masked_row_sinks", 2, [](DistCase& c) {
    c.B = 2;
    c.segments = c.masked_row = c.sinks = true;
  });
  add("soft_cap_sinks_dv", 4, [](DistCase& c) {
    c.soft_cap = 4.0;
    c.sinks = true;
    c.Dv = 24;
  });
  add("segments_non_causal", 1, [](DistCase& c) {
    c.causal = false;
    c.segments = true;
    c.layout = Layout::zigzag;
  });
  add("tq_lt_tk_causal", 2, [](DistCase& c) {
    c.Tq = 29;
    c.Tk = 47;
  });
  add("or_mask_with_gaps", 1, [](DistCase& c) {
    c.causal = false;
    c.mask = Mask::local(2, 0) | Mask::chunked_causal(13);
  });
  add("per_head_mask", 1, [](DistCase& c) {
    std::vector<Mask> m;
    for (std::int64_t h = 0; h < c.Hq; ++h)
      m.push_back(h % 3 == 0 ? Mask::causal() : h % 3 == 1 ? Mask::local(4, 2) : Mask::chunked_causal(9));
    c.causal = false;
    c.mask = Mask::per_head(std::move(m));
  });
  add("short_sequence", 1, [&](DistCase& c) { c.Tq = c.Tk = 2 * P - 1; });  // a chunk may be empty
  return v;
}

Report check_case(Communicator& comm, const std::string& op, const DistCase& c) {
  const int me = comm.rank(), P = comm.size();
  // The full problem, the same on every rank.
  attnops::testing::CaseSpec spec;
  spec.B = c.B, spec.Tq = c.Tq, spec.Tk = c.Tk, spec.Hq = c.Hq, spec.Hkv = c.Hkv, spec.D = c.D,
  spec.Dv = c.Dv;
  spec.causal = c.causal, spec.window = c.window, spec.chunk = c.chunk, spec.segments = c.segments;
  spec.soft_cap = c.soft_cap, spec.sinks = c.sinks, spec.mask = c.mask;
  attnops::testing::Case full =
      attnops::testing::make_case(spec, 1000 + static_cast<std::uint64_t>(c.Tq * 7 + c.Hq));
  if (c.masked_row) full.seg_q->data_as<std::int32_t>()[c.Tq / 2] = 1 << 30;  // no key has this id
  AttentionOptions opts = full.options;
  opts.return_lse = true;
  const Tensor dout = attnops::testing::random_tensor(DType::f32, {c.B, c.Tq, c.Hq, c.Dv}, 77);

  DistSettings settings;
  settings.layout = c.layout;
  settings.progress_rows = 7;  // several pieces per local call: progress between tiles is exercised
  Config config;
  config.backends = std::vector<Backend>{Backend::cpu};
  config.num_threads = 1;
  const DistributedAttention dist = get(op, config, settings);
  const Attention& local = dist.local();

  // Single process and oracle.
  const AttentionOutput single = local(full.q, full.k, full.v, opts);
  const AttentionGradients single_g = local.backward(full.q, full.k, full.v, single, dout, opts);
  const AttentionProblem fp = make_problem(full.q, full.k, full.v, opts, local.metadata());
  const native::ReferenceResult ref = native::reference_attention_f64(fp, false);
  const BackwardProblem bp =
      make_backward_problem(full.q, full.k, full.v, single.out, *single.lse, dout, opts, local.metadata());
  const native::ReferenceGradients ref_g = native::reference_backward_f64(bp);

  // This rank's shards.
  const ShardLayout ql = dist.layout_for(opts, c.Tq, P), kl = dist.layout_for(opts, c.Tk, P);
  const Tensor q = shard(full.q, ql, me), k = shard(full.k, kl, me), v = shard(full.v, kl, me);
  const Tensor g = shard(dout, ql, me);
  std::optional<Tensor> sq, skv;
  AttentionOptions ropts = opts;
  if (c.segments) {
    sq = shard(*full.seg_q, ql, me);
    skv = shard(*full.seg_kv, kl, me);
    ropts.segment_ids_q = sq->view();
    ropts.segment_ids_kv = skv->view();
  }
  const DistOutput out = dist(comm, q, k, v, ropts);
  const DistGradients grads = dist.backward(comm, q, k, v, out, g, ropts);

  std::ostringstream fail;
  if (P == 1) {
    const auto same = [&](const char* name, const Tensor& a, const Tensor& b) {
      if (!bitwise_equal(a, b))
        fail << name << " differs from the single-process call (P = 1 must be bitwise); ";
    };
    same("out", out.output.out, single.out);
    same("lse", *out.output.lse, *single.lse);
    same("dq", grads.gradients.dq, single_g.dq);
    same("dk", grads.gradients.dk, single_g.dk);
    same("dv", grads.gradients.dv, single_g.dv);
    if (c.sinks) same("dsinks", *grads.gradients.dsinks, *single_g.dsinks);
  }
  const std::vector<std::int64_t> qpos = positions_of(ql, me), kpos = positions_of(kl, me), all_heads = [&] {
    std::vector<std::int64_t> h(static_cast<std::size_t>(c.Hq));
    for (std::int64_t i = 0; i < c.Hq; ++i) h[static_cast<std::size_t>(i)] = i;
    return h;
  }();
  const auto check = [&](const char* name, const Tensor& got_shard, const Tensor& single_full,
                         const std::vector<double>& want, const std::vector<std::int64_t>& shape, int dim,
                         const std::vector<std::int64_t>& pos) {
    const Err d = compare(name, got_shard, want, shape, dim, pos);
    double single_err = 0;  // the single-process error on the same rows
    for_shard(shape, dim, pos, [&](std::int64_t f, std::int64_t) {
      const double w = want[static_cast<std::size_t>(f)], x = single_full.at(static_cast<std::size_t>(f));
      if (std::isfinite(w) && std::isfinite(x)) single_err = std::max(single_err, std::abs(x - w));
    });
    if (!d.finite_ok) fail << d.where << "; ";
    const double bound = 2 * single_err + 1e-7 * scale_of(want);
    if (!(d.max <= bound))
      fail << name << ": distributed error " << d.max << " > 2 x single-process error " << single_err
           << " (+ floor); ";
  };
  check("out", out.output.out, single.out, ref.out, {c.B, c.Tq, c.Hq, c.Dv}, 1, qpos);
  check("lse", *out.output.lse, *single.lse, ref.lse, {c.B, c.Hq, c.Tq}, 2, qpos);
  check("dq", grads.gradients.dq, single_g.dq, ref_g.dq, {c.B, c.Tq, c.Hq, c.D}, 1, qpos);
  check("dk", grads.gradients.dk, single_g.dk, ref_g.dk, {c.B, c.Tk, c.Hkv, c.D}, 1, kpos);
  check("dv", grads.gradients.dv, single_g.dv, ref_g.dv, {c.B, c.Tk, c.Hkv, c.Dv}, 1, kpos);
  if (c.sinks) {
    if (!grads.gradients.dsinks)
      fail << "dsinks missing; ";
    else
      check("dsinks", *grads.gradients.dsinks, *single_g.dsinks, ref_g.dsinks, {c.Hq}, 0, all_heads);
  }
  if (out.output.decision.op != op || out.output.decision.run.kernel.find(op + "(") != 0)
    fail << "decision does not name " << op << ": " << out.output.decision.to_json() << "; ";
  Report r;
  r.message = fail.str();
  r.ok = r.message.empty();
  if (!r.ok)
    r.message =
        op + " " + c.name + " rank " + std::to_string(me) + "/" + std::to_string(P) + ": " + r.message;
  return r;
}

std::string check_matrix(Communicator& comm, const std::string& op) {
  std::string failed;
  for (const DistCase& c : matrix(comm.size())) {
    const Report r = check_case(comm, op, c);
    if (!r.ok) failed += r.message + "\n";
  }
  return failed;
}

}  // namespace attnops::dist::testing
