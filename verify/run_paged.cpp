#include "verify/run_paged.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "attnops/ext/problem.h"
#include "backends/native/reference.h"

namespace attnops::verify {

namespace {

using i64 = std::int64_t;

struct PagedOracle {
  std::vector<double> out, lse;  // [N, Hq, Dv], [N, Hq]
  Tolerance tol;
};

i64 index_at(const Tensor& t, i64 i) {
  return t.dtype() == DType::i64 ? t.data_as<std::int64_t>()[i] : t.data_as<std::int32_t>()[i];
}

// A view of one row of the page table.
TensorView table_row(const Tensor& table, i64 s) {
  const i64 W = table.dim(1);
  return TensorView(
      static_cast<const char*>(table.data()) + s * W * static_cast<i64>(dtype_size(table.dtype())),
      table.dtype(), {W});
}

// Sequence s's keys and values as the oracle sees an 8-bit cache: code x scale in f32 (what the
// kernels attend over, kv_quant.h), from the codes and scales as drawn, not read back from the
// cache (so a cache or gather() that misplaces a scale is caught too).
PagedKVCache::Dense dequantized(const PagedSpec& spec, const PagedInputs& in, i64 s, i64 kl) {
  const DType t = *spec.kv8;
  const bool per_token = spec.kv_scales == KVScales::per_token;
  const i64 H = spec.Hkv, ps = spec.page_size;
  PagedKVCache::Dense d{Tensor(DType::f32, {1, kl, H, spec.D}), Tensor(DType::f32, {1, kl, H, spec.Dv})};
  const std::vector<i64>& pages = in.pages[static_cast<std::size_t>(s)];
  for (auto [out, codes, scales, Dh] : {std::tuple{&d.k, &in.k_codes, &in.k_scales, spec.D},
                                        std::tuple{&d.v, &in.v_codes, &in.v_scales, spec.Dv}})
    for (i64 j = 0; j < kl; ++j)
      for (i64 h = 0; h < H; ++h) {
        const i64 token = (pages[static_cast<std::size_t>(j / ps)] * ps + j % ps) * H + h;
        const float sc = (*scales)[static_cast<std::size_t>(per_token ? token : 0)];
        float* row = out->data_as<float>() + (j * H + h) * Dh;
        for (i64 e = 0; e < Dh; ++e)
          row[e] = code_value(t, (*codes)[static_cast<std::size_t>(token * Dh + e)]) * sc;
      }
  return d;
}

PagedOracle paged_oracle(const PagedSpec& spec, const PagedInputs& in, const PagedPlan& plan) {
  const i64 N = spec.rows(), Hq = spec.Hq, Dv = spec.Dv;
  PagedOracle o;
  o.out.assign(static_cast<std::size_t>(N * Hq * Dv), 0.0);
  o.lse.assign(static_cast<std::size_t>(N * Hq), -std::numeric_limits<double>::infinity());
  o.tol = base_tolerance(spec.dtype);
  const i64 S = spec.num_seqs >= 0 ? spec.num_seqs : static_cast<i64>(spec.seqs.size());
  OperationMetadata md;
  md.softmax_scale = spec.scale;
  const i64 esize = static_cast<i64>(dtype_size(spec.dtype));
  for (i64 s = 0; s < S; ++s) {
    const i64 q0 = index_at(in.cu, s), ql = spec.seqs[static_cast<std::size_t>(s)].q_len,
              kl = spec.seqs[static_cast<std::size_t>(s)].kv_len;
    if (ql == 0) continue;
    const PagedKVCache::Dense kv =
        spec.kv8 ? dequantized(spec, in, s, kl) : in.cache.gather(table_row(in.page_table, s), kl);
    const TensorView q_rows(static_cast<const char*>(in.q.data()) + q0 * Hq * spec.D * esize, spec.dtype,
                            {1, ql, Hq, spec.D});
    // An 8-bit cache's oracle problem is f32 (q's values are exact in f32).
    const Tensor q32 = spec.kv8 ? Tensor::copy_of(q_rows, DType::f32) : Tensor();
    const TensorView q = spec.kv8 ? q32.view() : q_rows;
    AttentionOptions opts;
    opts.causal = spec.causal;
    opts.sliding_window = spec.window;
    opts.chunk_size = spec.chunk;
    opts.logits_soft_cap = spec.soft_cap;
    opts.sinks = in.options.sinks;
    const AttentionProblem p = make_problem(q, kv.k, kv.v, opts, md);
    const native::ReferenceResult r = native::reference_attention_f64(p, false);
    std::copy(r.out.begin(), r.out.end(), o.out.begin() + q0 * Hq * Dv);
    for (i64 h = 0; h < Hq; ++h)
      for (i64 i = 0; i < ql; ++i)
        o.lse[static_cast<std::size_t>((q0 + i) * Hq + h)] = r.lse[static_cast<std::size_t>(h * ql + i)];
    Tolerance t = problem_tolerance(p, spec.dtype);
    // A tile item reads an 8-bit cache rounded to q's dtype (the tiled kernel's input).
    if (spec.kv8 && std::any_of(plan.work().begin(), plan.work().end(), [&](const PagedWorkItem& w) {
          return w.seq == s && w.kind == PagedWorkKind::tile;
        })) {
      const Tolerance r = rounded_kv_tolerance(p, spec.dtype);
      t.out += r.out, t.lse += r.lse;
    }
    o.tol.out = std::max(o.tol.out, t.out), o.tol.lse = std::max(o.tol.lse, t.lse);
  }
  return o;
}

}  // namespace

std::vector<Finding> run_paged(const RunSettings& rs, const PagedSpec& spec,
                               const std::vector<Target>& targets, bool repeat, Tally& tally) {
  std::vector<Finding> found;
  bool any = false;
  for (const Target& t : targets) any = any || t.op == "ragged_paged";
  if (!any) return found;
  const std::string problem = spec.describe();
  const PagedInputs in = materialize(spec);
  const i64 N = spec.rows();
  PagedPlan plan, flipped;
  PagedOracle oracle;
  PagedAttentionOptions flipped_options = in.options;
  flipped_options.share_prefixes = !in.options.share_prefixes;
  try {
    plan = plan_paged(in.batch, in.cache.spec(), N, spec.Hq, in.options);
    if (spec.both_ways) flipped = plan_paged(in.batch, in.cache.spec(), N, spec.Hq, flipped_options);
    oracle = paged_oracle(spec, in, plan);
  } catch (const Error& e) {
    tally.skip(std::string("paged problem refused: ") + std::string(error_code_name(e.code())) + ": " +
               e.what());
    return found;
  }
  // The sequence checked alone (batch invariance): the active one with the most keys.
  const i64 S = plan.num_seqs();
  i64 alone = -1;
  for (i64 s = 0; s < S; ++s)
    if (plan.q_len(s) > 0 && (alone < 0 || plan.kv_len(s) > plan.kv_len(alone))) alone = s;
  const std::vector<i64> out_shape{N, spec.Hq, spec.Dv}, lse_shape{N, spec.Hq};

  // Shared items only where sequences share pages, and none with sharing off.
  for (const PagedPlan* pl : {&plan, &flipped}) {
    if (pl->empty() || pl->shared_keys() == 0) continue;
    const bool on = pl == &plan ? in.options.share_prefixes : flipped_options.share_prefixes;
    if (!on || !spec.shared_prefix)
      for (const Target& t : targets)
        if (t.op == "ragged_paged") {
          found.push_back({t,
                           {"plan", 0, 0,
                            std::to_string(pl->shared_keys()) + " shared keys planned " +
                                (on ? "for sequences that share no page" : "with share_prefixes off")},
                           problem});
          break;
        }
  }
  // The calls' label: the cache's kind and whether the plan shares prefixes.
  std::string kind;
  if (spec.kv8)
    kind = std::string(dtype_name(*spec.kv8)) + " " + std::string(kv_scales_name(spec.kv_scales)) + " cache";
  if (plan.shared_keys() > 0 || (!flipped.empty() && flipped.shared_keys() > 0))
    kind += std::string(kind.empty() ? "" : ", ") + "shared prefixes";
  if (!kind.empty()) kind = " (" + kind + ")";

  std::map<std::string, std::pair<int, std::vector<Tensor>>> baselines;
  for (const Target& t : targets) {
    if (t.op != "ragged_paged") continue;
    if (t.backend == Backend::gpu && spec.work() > rs.gpu_max_work) {
      tally.skip("gpu: problem over the gpu work cap");
      continue;
    }
    apply_environment(t);
    const auto guarded = [&](auto&& call) {
      try {
        call();
        return true;
      } catch (const Error& e) {
        if (auto why = skip_reason(e))
          tally.skip("ragged_paged " + std::string(backend_name(t.backend)) + ": " + *why);
        else
          found.push_back(
              {t, {"error", 0, 0, std::string(error_code_name(e.code())) + ": " + e.what()}, problem});
        return false;
      }
    };
    Attention attn;
    if (!guarded([&] {
          attn = rs.registry->get("ragged_paged", forced_config(t.backend, t.threads, spec.scale));
        }))
      continue;
    const auto call = [&](AttentionOutput& out) {
      out = attn.paged(in.q, in.cache, plan, in.options);
      ++tally.calls;
      ++tally.calls_by_target["ragged_paged forward " + std::string(backend_name(t.backend)) + " " +
                              t.kernel + kind];
      if (rs.tamper) rs.tamper(t, out.out);
    };
    AttentionOutput out;
    if (!guarded([&] { call(out); })) continue;
    bool refused = false;
    if (auto m = check_decision(t, out.decision, "ragged_paged", &refused)) found.push_back({t, *m, problem});
    if (refused)
      tally.skip("gpu variant " + t.kernel +
                 " not applicable here: the default variant ran (and was checked)");
    if (t.backend != Backend::gpu && !out.decision.run.batch_invariant)
      found.push_back(
          {t, {"decision", 0, 0, "batch_invariant not reported: " + out.decision.to_json()}, problem});
    if (t.backend == Backend::cpu && out.decision.run.shared_keys != plan.shared_keys())
      found.push_back({t,
                       {"decision", 0, 0,
                        "shared_keys " + std::to_string(out.decision.run.shared_keys) + ", the plan has " +
                            std::to_string(plan.shared_keys()) + ": " + out.decision.to_json()},
                       problem});
    if (auto m = compare_values("out", out.out, oracle.out, out_shape, oracle.tol.out))
      found.push_back({t, *m, problem});
    if (spec.return_lse) {
      if (!out.lse)
        found.push_back({t, {"lse", 0, 0, "return_lse was set but no lse came back"}, problem});
      else if (auto m = compare_values("lse", *out.lse, oracle.lse, lse_shape, oracle.tol.lse))
        found.push_back({t, *m, problem});
    }
    ++tally.checks;
    std::vector<Tensor> results{out.out};
    if (out.lse) results.push_back(*out.lse);
    if (repeat) {
      AttentionOutput again;
      if (guarded([&] { call(again); })) {
        for (std::size_t i = 0; i < results.size(); ++i) {
          const Tensor& b = i == 0 ? again.out : *again.lse;
          if (auto m = compare_bitwise(i == 0 ? "out" : "lse", results[i], b)) {
            m->what = "call-to-call determinism (" + m->what + ")";
            found.push_back({t, *m, problem});
          }
        }
        ++tally.checks;
      }
    }
    // The same batch planned with share_prefixes flipped: the same bits on every backend (shared
    // items read the keys once; each row's arithmetic and the merge of its splits stay those of
    // the unshared run, README "Shared prefixes").
    if (!flipped.empty()) {
      AttentionOutput other;
      if (guarded([&] {
            other = attn.paged(in.q, in.cache, flipped, flipped_options);
            ++tally.calls;
            if (rs.tamper) rs.tamper(t, other.out);
          })) {
        const std::string how = std::string("share_prefixes ") + (in.options.share_prefixes ? "on" : "off") +
                                " vs " + (in.options.share_prefixes ? "off" : "on") + " (";
        for (std::size_t i = 0; i < results.size(); ++i) {
          if (i == 1 && !other.lse) break;
          if (auto m = compare_bitwise(i == 0 ? "out" : "lse", results[i], i == 0 ? other.out : *other.lse)) {
            m->what = how + m->what + ")";
            found.push_back({t, *m, problem});
          }
        }
        ++tally.checks;
      }
    }
    // Batch invariance: the sequence alone, with its own plan.
    if (alone >= 0) {
      const i64 q0 = plan.q_begin(alone), ql = plan.q_len(alone), kl = plan.kv_len(alone);
      const bool i64_ids = spec.index_i64;
      Tensor cu(i64_ids ? DType::i64 : DType::i32, {2}), kv(cu.dtype(), {1});
      const Tensor row = Tensor::copy_of(table_row(in.page_table, alone));
      Tensor table(in.page_table.dtype(), {1, row.dim(0)});
      std::memcpy(table.data(), row.data(), row.nbytes());
      if (i64_ids)
        cu.data_as<std::int64_t>()[1] = ql, kv.data_as<std::int64_t>()[0] = kl;
      else
        cu.data_as<std::int32_t>()[1] = static_cast<std::int32_t>(ql),
        kv.data_as<std::int32_t>()[0] = static_cast<std::int32_t>(kl);
      const i64 row_bytes = spec.Hq * spec.D * static_cast<i64>(dtype_size(spec.dtype));
      Tensor q1(spec.dtype, {ql, spec.Hq, spec.D});
      std::memcpy(q1.data(), static_cast<const char*>(in.q.data()) + q0 * row_bytes,
                  static_cast<std::size_t>(ql * row_bytes));
      AttentionOutput one;
      if (guarded([&] {
            const PagedPlan p1 =
                plan_paged(RaggedBatch{cu, kv, table}, in.cache.spec(), ql, spec.Hq, in.options);
            one = attn.paged(q1, in.cache, p1, in.options);
            ++tally.calls;
          })) {
        if (auto m = compare_bitwise_rows("out", out.out, q0, one.out)) {
          m->what = "batch invariance (out, sequence " + std::to_string(alone) + " alone)";
          found.push_back({t, *m, problem});
        }
        if (out.lse && one.lse)
          if (auto m = compare_bitwise_rows("lse", *out.lse, q0, *one.lse)) {
            m->what = "batch invariance (lse, sequence " + std::to_string(alone) + " alone)";
            found.push_back({t, *m, problem});
          }
        ++tally.checks;
      }
    }
    // Every thread count gives the same bits (native and cpu).
    if (t.backend != Backend::gpu) {
      auto& [threads, tensors] = baselines[std::string(backend_name(t.backend)) + "|" + t.kernel];
      if (threads == 0) {
        threads = t.threads, tensors = results;
      } else if (threads != t.threads) {
        for (std::size_t i = 0; i < results.size() && i < tensors.size(); ++i)
          if (auto m = compare_bitwise(i == 0 ? "out" : "lse", results[i], tensors[i])) {
            m->what =
                "bitwise across thread counts (vs threads=" + std::to_string(threads) + ", " + m->what + ")";
            found.push_back({t, *m, problem});
          }
        ++tally.checks;
      }
    }
  }
  return found;
}

}  // namespace attnops::verify
