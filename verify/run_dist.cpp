#include "verify/run_dist.h"

#include <memory>
#include <mutex>

#include "attnops/dist/local_communicator.h"
#include "attnops/dist/sequence_parallel.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"

namespace attnops::verify {

namespace {

using i64 = std::int64_t;

bool ulysses_ranks_ok(const DenseSpec& s, int P) {
  return s.Hq % P == 0 && (s.Hkv % P == 0 || P % s.Hkv == 0);
}

std::optional<Mismatch> bitwise(const std::string& what, const Tensor& a, const Tensor& b) {
  auto m = compare_bitwise(what, a, b);
  if (m) m->what = "one rank is the local call bitwise (" + m->what + ")";
  return m;
}

}  // namespace

std::string DistSpec::describe() const {
  return "ranks=" + std::to_string(ranks) + " layout=" + (layout.empty() ? "default" : layout) +
         " local=" + local_operator + " progress_rows=" + std::to_string(progress_rows) +
         " eager=" + std::to_string(eager_limit);
}

DistSpec draw_dist(const DenseSpec& spec, const std::string& op) {
  Rng rng = Rng::for_case(spec.seed, spec.index, kStreamDist + (op == "ulysses" ? 1000 : 0));
  DistSpec d;
  std::vector<int> ranks;
  for (int P = 1; P <= 4; ++P)
    if (op != "ulysses" || ulysses_ranks_ok(spec, P)) ranks.push_back(P);
  d.ranks = rng.pick(ranks);
  d.layout = rng.pick(std::vector<std::string>{"", "", "contiguous", "zigzag"});
  d.local_operator =
      rng.pick(std::vector<std::string>{"flash_attn2", "flash_attn2", "vanilla", "blocksparse"});
  d.progress_rows = rng.pick(std::vector<i64>{0, 1, 7, 64, 1024});
  d.eager_limit = rng.pick(std::vector<std::size_t>{0, 128, std::size_t{1} << 20});
  return d;
}

std::vector<Finding> run_dist(const RunSettings& rs, const DenseSpec& spec,
                              const std::vector<Target>& targets, Tally& tally) {
  std::vector<Finding> found;
  bool any = false;
  for (const Target& t : targets) any = any || is_dist_op(t.op);
  if (!any) return found;
  // What the distributed operators take: no bias, no weights.
  DenseSpec ds = spec;
  ds.bias = BiasShape::none;
  ds.return_weights = false;
  const DenseInputs in = materialize(ds);
  AttentionOptions opts = in.options;
  opts.return_lse = true;
  OperationMetadata md;
  md.softmax_scale = ds.scale;
  AttentionProblem p;
  try {
    p = make_problem(in.q, in.k, in.v, opts, md);
  } catch (const Error& e) {
    tally.skip(std::string("problem refused by make_problem: ") + std::string(error_code_name(e.code())));
    return found;
  }
  const native::ReferenceResult ref = native::reference_attention_f64(p, false);
  std::unique_ptr<native::ReferenceGradients> ref_g;
  const Tolerance base = problem_tolerance(p);
  const i64 B = ds.B, Tq = ds.Tq, Tk = ds.Tk, Hq = ds.Hq, Hkv = ds.Hkv, D = ds.D, Dv = ds.Dv;

  for (const Target& t : targets) {
    if (!is_dist_op(t.op)) continue;
    if (t.backend == Backend::gpu && ds.work() > rs.gpu_max_work) {
      tally.skip("gpu: problem over the gpu work cap");
      continue;
    }
    const DistSpec d = draw_dist(ds, t.op);
    const std::string problem = ds.describe() + " " + d.describe();
    if (t.op == "ulysses" && !ulysses_ranks_ok(ds, d.ranks)) continue;
    apply_environment(t);
    const double f = ds.dtype == DType::f32 ? 2.0 : d.ranks + 1.0;
    Tensor out(ds.dtype, {B, Tq, Hq, Dv}), lse(DType::f32, {B, Hq, Tq}), dq(ds.dtype, {B, Tq, Hq, D}),
        dk(ds.dtype, {B, Tk, Hkv, D}), dv(ds.dtype, {B, Tk, Hkv, Dv});
    std::optional<Tensor> dsinks;
    std::vector<DispatchDecision> decisions(static_cast<std::size_t>(d.ranks));
    std::mutex mu;
    const bool backward = t.pass == Pass::backward;
    try {
      dist::DistSettings settings;
      if (!d.layout.empty()) settings.layout = dist::parse_layout(d.layout);
      settings.local_operator = d.local_operator;
      settings.progress_rows = d.progress_rows;
      const dist::DistributedAttention op =
          dist::get(*rs.registry, t.op, config_for(ds, t.backend, t.threads), settings);
      const dist::ShardLayout ql = op.layout_for(opts, Tq, d.ranks), kl = op.layout_for(opts, Tk, d.ranks);
      dist::run_local_ranks(
          d.ranks,
          [&](dist::Communicator& comm) {
            const int r = comm.rank();
            const Tensor q = dist::shard(in.q, ql, r), k = dist::shard(in.k, kl, r),
                         v = dist::shard(in.v, kl, r);
            AttentionOptions ro = opts;
            std::optional<Tensor> sq, skv;
            if (in.seg_q) {
              sq = dist::shard(*in.seg_q, ql, r);
              skv = dist::shard(*in.seg_kv, kl, r);
              ro.segment_ids_q = sq->view();
              ro.segment_ids_kv = skv->view();
            }
            const dist::DistOutput o = op(comm, q, k, v, ro);
            std::optional<dist::DistGradients> g;
            if (backward) g = op.backward(comm, q, k, v, o, dist::shard(in.dout, ql, r), ro);
            const std::lock_guard<std::mutex> lock(mu);
            dist::unshard_into(o.output.out, ql, r, out, 1);
            dist::unshard_into(*o.output.lse, ql, r, lse, 2);
            decisions[static_cast<std::size_t>(r)] = o.output.decision;
            if (g) {
              dist::unshard_into(g->gradients.dq, ql, r, dq, 1);
              dist::unshard_into(g->gradients.dk, kl, r, dk, 1);
              dist::unshard_into(g->gradients.dv, kl, r, dv, 1);
              if (r == 0) dsinks = g->gradients.dsinks;
            }
          },
          d.eager_limit);
      ++tally.calls;
      ++tally.calls_by_target[t.op + " " + std::string(pass_name(t.pass)) + " " +
                              std::string(backend_name(t.backend)) + " " + t.kernel];
      if (rs.tamper) rs.tamper(t, backward ? dq : out);
      // A rank whose rows see none of the keys runs no local call and names no tier (its kernel
      // ends in ":cpu"); every rank that ran one must name the tier asked for.
      for (const DispatchDecision& dd : decisions)
        if (auto m = check_decision(t, dd, t.op, nullptr, true)) {
          found.push_back({t, *m, problem});
          break;
        }
      if (auto m = compare_values("out", out, ref.out, {B, Tq, Hq, Dv}, f * base.out))
        found.push_back({t, *m, problem});
      if (auto m = compare_values("lse", lse, ref.lse, {B, Hq, Tq}, f * base.lse))
        found.push_back({t, *m, problem});
      ++tally.checks;
      if (backward) {
        if (!ref_g) {
          const BackwardProblem bp = make_backward_problem(in.q, in.k, in.v, out, lse, in.dout, opts, md);
          ref_g = std::make_unique<native::ReferenceGradients>(native::reference_backward_f64(bp));
        }
        const double tg = f * base.grad;
        if (auto m = compare_values("dq", dq, ref_g->dq, {B, Tq, Hq, D}, tg, true))
          found.push_back({t, *m, problem});
        if (auto m = compare_values("dk", dk, ref_g->dk, {B, Tk, Hkv, D}, tg, true))
          found.push_back({t, *m, problem});
        if (auto m = compare_values("dv", dv, ref_g->dv, {B, Tk, Hkv, Dv}, tg, true))
          found.push_back({t, *m, problem});
        if (!ref_g->dsinks.empty() && dsinks)
          if (auto m = compare_values("dsinks", *dsinks, ref_g->dsinks, {Hq}, tg, true))
            found.push_back({t, *m, problem});
        ++tally.checks;
      }
      if (d.ranks == 1) {  // the local operator's own call, bitwise
        const AttentionOutput one = op.local()(in.q, in.k, in.v, opts);
        if (auto m = bitwise("out", out, one.out)) found.push_back({t, *m, problem});
        if (auto m = bitwise("lse", lse, *one.lse)) found.push_back({t, *m, problem});
        ++tally.checks;
      }
    } catch (const Error& e) {
      if (auto why = skip_reason(e))
        tally.skip(t.op + " " + std::string(backend_name(t.backend)) + ": " + *why);
      else
        found.push_back(
            {t, {"error", 0, 0, std::string(error_code_name(e.code())) + ": " + e.what()}, problem});
    }
  }
  return found;
}

}  // namespace attnops::verify
