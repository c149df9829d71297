#include "verify/run_dense.h"

#include <map>
#include <memory>

#include "attnops/backward.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"

namespace attnops::verify {

namespace {

using i64 = std::int64_t;

// The oracle of one case, computed once and shared by every target.
struct Oracle {
  AttentionProblem p;
  native::ReferenceResult fwd;
  Tolerance tol;
  std::unique_ptr<native::ReferenceGradients> grads;
};

// A forward result kept for the backward targets of its group (operator, backend, kernel): all
// thread counts of a group differentiate the same forward, so their gradients can be compared
// bitwise.
struct Forward {
  AttentionOutput out;
};

// First result of each group and pass, for the bitwise comparison across thread counts.
struct Baseline {
  int threads = 0;
  std::vector<Tensor> tensors;
};

std::string group_of(const Target& t) {
  return t.op + "|" + std::string(backend_name(t.backend)) + "|" + t.kernel;
}

void add(std::vector<Finding>& f, const Target& t, const std::string& problem,
         const std::optional<Mismatch>& m) {
  if (m) f.push_back({t, *m, problem});
}

std::vector<Tensor> grad_tensors(const AttentionGradients& g) {
  std::vector<Tensor> v{g.dq, g.dk, g.dv};
  if (g.dsinks) v.push_back(*g.dsinks);
  if (g.dbias) v.push_back(*g.dbias);
  return v;
}

std::vector<Tensor> out_tensors(const AttentionOutput& o) {
  std::vector<Tensor> v{o.out};
  if (o.lse) v.push_back(*o.lse);
  if (o.attention_weights) v.push_back(*o.attention_weights);
  return v;
}

const char* const kOutNames[] = {"out", "lse", "weights"};
const char* const kGradNames[] = {"dq", "dk", "dv", "dsinks", "dbias"};

std::optional<Mismatch> bitwise_all(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                                    const char* const* names, const std::string& what) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (auto m = compare_bitwise(names[i], a[i], b[i])) {
      m->what = what + " (" + m->what + ")";
      return m;
    }
  if (a.size() != b.size()) return Mismatch{what, 0, 0, "different outputs were returned"};
  return std::nullopt;
}

}  // namespace

std::vector<Finding> run_dense(const RunSettings& rs, const DenseSpec& spec,
                               const std::vector<Target>& targets, bool repeat, Tally& tally) {
  std::vector<Finding> found;
  const std::string problem = spec.describe();
  bool any = false;
  for (const Target& t : targets) any = any || is_dense_op(t.op);
  if (!any) return found;

  const DenseInputs in = materialize(spec);
  OperationMetadata md;
  md.softmax_scale = spec.scale;
  Oracle oracle;
  try {
    AttentionOptions o = in.options;
    o.return_weights = spec.return_weights;
    oracle.p = make_problem(in.q, in.k, in.v, o, md);
  } catch (const Error& e) {
    // The library refuses the problem as drawn: the generator's to fix, not a kernel mismatch.
    tally.skip(std::string("problem refused by make_problem: ") + std::string(error_code_name(e.code())));
    return found;
  }
  oracle.fwd = native::reference_attention_f64(oracle.p, spec.return_weights);
  oracle.tol = problem_tolerance(oracle.p);
  const std::vector<i64> out_shape{spec.B, spec.Tq, spec.Hq, spec.Dv}, lse_shape{spec.B, spec.Hq, spec.Tq},
      w_shape{spec.B, spec.Hq, spec.Tq, spec.Tk};

  const bool empty = spec.B * spec.Tq * spec.Tk * spec.Hq == 0;
  std::map<std::string, Forward> residuals;
  std::map<std::string, Baseline> baselines;
  for (const Target& t : targets) {
    if (!is_dense_op(t.op)) continue;
    if (t.backend == Backend::gpu && spec.work() > rs.gpu_max_work) {
      tally.skip("gpu: problem over the gpu work cap");
      continue;
    }
    apply_environment(t);
    Attention attn;
    AttentionOptions o = in.options;
    if (t.op != "vanilla") o.return_weights = false;
    if (t.pass == Pass::backward) o.return_lse = true, o.return_weights = false;
    const bool deterministic = t.backend != Backend::gpu || t.pass == Pass::backward;
    const std::string group = group_of(t);
    // Runs `call`, turning an attnops::Error into a skip or a finding; false when it threw.
    const auto guarded = [&](auto&& call) {
      try {
        call();
        return true;
      } catch (const Error& e) {
        if (auto why = skip_reason(e)) {
          tally.skip(t.op + " " + std::string(backend_name(t.backend)) + ": " + *why);
        } else {
          found.push_back(
              {t, {"error", 0, 0, std::string(error_code_name(e.code())) + ": " + e.what()}, problem});
        }
        return false;
      }
    };
    const auto forward = [&](const AttentionOptions& opts, AttentionOutput& out) {
      out = attn(in.q, in.k, in.v, opts);
      ++tally.calls;
      ++tally.calls_by_target[t.op + " forward " + std::string(backend_name(t.backend)) + " " + t.kernel];
      if (rs.tamper) rs.tamper(t, out.out);
    };
    // The forward's checks: decision, oracle, determinism, thread counts.
    const auto check_forward = [&](const AttentionOptions& opts, const AttentionOutput& out) {
      bool refused = false;
      add(found, t, problem, check_decision(t, out.decision, "", &refused, empty));
      if (refused)
        tally.skip("gpu variant " + t.kernel +
                   " not applicable here: the default variant ran (and was checked)");
      add(found, t, problem, compare_values("out", out.out, oracle.fwd.out, out_shape, oracle.tol.out));
      if (opts.return_lse) {
        if (!out.lse)
          found.push_back({t, {"lse", 0, 0, "return_lse was set but no lse came back"}, problem});
        else
          add(found, t, problem, compare_values("lse", *out.lse, oracle.fwd.lse, lse_shape, oracle.tol.lse));
      }
      if (opts.return_weights && out.attention_weights)
        add(found, t, problem,
            compare_values("weights", *out.attention_weights, oracle.fwd.weights, w_shape, oracle.tol.out));
      tally.checks += 1;
      if (repeat && deterministic) {
        AttentionOutput again;
        if (guarded([&] { forward(opts, again); })) {
          add(found, t, problem,
              bitwise_all(out_tensors(out), out_tensors(again), kOutNames, "call-to-call determinism"));
          ++tally.checks;
        }
      }
      // The tiled forward (flash_attn2, blocksparse without a fallback) is bitwise the same at
      // every thread count (README, Kernels); vanilla only per thread count.
      if (t.backend == Backend::cpu && out.decision.op != "vanilla") {
        Baseline& b = baselines[group + "|forward|" + std::to_string(opts.return_lse)];
        if (b.threads == 0) {
          b.threads = t.threads, b.tensors = out_tensors(out);
        } else if (b.threads != t.threads) {
          add(found, t, problem,
              bitwise_all(out_tensors(out), b.tensors, kOutNames,
                          "bitwise across thread counts (vs threads=" + std::to_string(b.threads) + ")"));
          ++tally.checks;
        }
      }
    };

    if (!guarded([&] { attn = rs.registry->get(t.op, config_for(spec, t.backend, t.threads)); })) continue;
    if (t.pass == Pass::forward) {
      AttentionOutput out;
      if (!guarded([&] { forward(o, out); })) continue;
      check_forward(o, out);
      if (o.return_lse && !residuals.count(group)) residuals[group] = Forward{out};
      continue;
    }

    // Backward: differentiate the group's forward (run here if no forward target kept one).
    if (!residuals.count(group)) {
      AttentionOutput out;
      if (!guarded([&] { forward(o, out); })) continue;
      check_forward(o, out);
      residuals[group] = Forward{out};
    }
    const AttentionOutput& fwd = residuals[group].out;
    if (!fwd.lse) continue;
    AttentionGradients g;
    const auto backward = [&](AttentionGradients& r) {
      r = attn.backward(in.q, in.k, in.v, fwd, in.dout, o);
      ++tally.calls;
      ++tally.calls_by_target[t.op + " backward " + std::string(backend_name(t.backend)) + " " + t.kernel];
      if (rs.tamper) rs.tamper(t, r.dq);
    };
    if (!guarded([&] { backward(g); })) continue;
    add(found, t, problem, check_decision(t, g.decision, "", nullptr, empty));
    if (!oracle.grads) {
      const BackwardProblem bp = make_backward_problem(in.q, in.k, in.v, fwd.out, *fwd.lse, in.dout, o, md);
      oracle.grads = std::make_unique<native::ReferenceGradients>(native::reference_backward_f64(bp));
    }
    const native::ReferenceGradients& want = *oracle.grads;
    const double tol = oracle.tol.grad;
    add(found, t, problem,
        compare_values("dq", g.dq, want.dq, {spec.B, spec.Tq, spec.Hq, spec.D}, tol, true));
    add(found, t, problem,
        compare_values("dk", g.dk, want.dk, {spec.B, spec.Tk, spec.Hkv, spec.D}, tol, true));
    add(found, t, problem,
        compare_values("dv", g.dv, want.dv, {spec.B, spec.Tk, spec.Hkv, spec.Dv}, tol, true));
    if (!want.dsinks.empty()) {
      if (!g.dsinks)
        found.push_back({t, {"dsinks", 0, 0, "sinks were given but no dsinks came back"}, problem});
      else
        add(found, t, problem, compare_values("dsinks", *g.dsinks, want.dsinks, {spec.Hq}, tol, true));
    }
    if (!want.dbias.empty()) {
      if (!g.dbias)
        found.push_back({t, {"dbias", 0, 0, "a bias was given but no dbias came back"}, problem});
      else
        add(found, t, problem, compare_values("dbias", *g.dbias, want.dbias, g.dbias->shape(), tol, true));
    }
    ++tally.checks;
    if (repeat && deterministic) {
      AttentionGradients again;
      if (guarded([&] { backward(again); })) {
        add(found, t, problem,
            bitwise_all(grad_tensors(g), grad_tensors(again), kGradNames, "call-to-call determinism"));
        ++tally.checks;
      }
    }
    // Every cpu backward is bitwise the same at every thread count (README, the CPU backward).
    if (t.backend == Backend::cpu) {
      Baseline& b = baselines[group + "|backward"];
      if (b.threads == 0) {
        b.threads = t.threads, b.tensors = grad_tensors(g);
      } else if (b.threads != t.threads) {
        add(found, t, problem,
            bitwise_all(grad_tensors(g), b.tensors, kGradNames,
                        "bitwise across thread counts (vs threads=" + std::to_string(b.threads) + ")"));
        ++tally.checks;
      }
    }
  }
  return found;
}

}  // namespace attnops::verify
