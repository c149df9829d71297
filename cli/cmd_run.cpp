// `attnops run`: one attention call on .npy inputs, output (and optionally lse / weights) to .npy.
//
//   attnops run --op NAME --q Q.npy --k K.npy --v V.npy --out O.npy [--config FILE.yaml]
//     [--backend auto|native|cpu|gpu|tpu] [--causal | --no-causal] [--scale X] [--window L,R]
//     [--chunk N] [--soft-cap X] [--sinks S.npy] [--bias B.npy]
//     [--segment-ids-q SQ.npy --segment-ids-kv SKV.npy] [--dtype f32|f16|bf16]
//     [--lse-out L.npy] [--weights-out W.npy] [--threads N] [--explain] [--profile]
//     [--dout G.npy --dq-out DQ.npy --dk-out DK.npy --dv-out DV.npy [--dsinks-out] [--dbias-out]]
//   attnops run --op ragged_paged --q Q.npy --k-pages KP.npy --v-pages VP.npy --page-table PT.npy
//     --cu-seqlens-q CU.npy --kv-lens KL.npy --out O.npy [--lse-out L.npy] ... (run_paged.h)
//
// --explain prints the DispatchDecision as one JSON object, the last line on stderr; with
// --dout (the backward, see run_backward.h) the backward's decision follows on its own line.
// --profile (or ATTNOPS_PROFILE=1) adds the timings of the call to it.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "attnops/attnops.h"
#include "cli/commands.h"
#include "cli/npy.h"
#include "cli/output_set.h"
#include "cli/run_backward.h"
#include "cli/run_paged.h"
#include "cli/settings.h"

namespace attnops::cli {
namespace {

struct RunArgs {
  std::string op, q, k, v, out, config, backend, window, sinks, bias, seg_q, seg_kv, dtype, lse_out,
      weights_out;
  bool causal = false, no_causal = false, explain = false, profile = false;
  double scale = 0, soft_cap = 0;
  long long chunk = 0;
  int threads = 0;
  CLI::Option *scale_opt = nullptr, *soft_cap_opt = nullptr, *chunk_opt = nullptr, *threads_opt = nullptr;
  BackwardArgs backward;
  PagedArgs paged;  // --k-pages ...: a paged run (run_paged.h)
};

Window parse_window(const std::string& text) {
  const auto parts = split(text, ',');
  if (parts.size() != 2)
    throw Error(ErrorCode::invalid_argument, "--window: expected L,R (two integers), got '" + text + "'");
  return Window{parse_integer(parts[0], "--window left"), parse_integer(parts[1], "--window right")};
}

// The paged run's settings: the same overrides and mask options as a dense run.
PagedRun paged_run(const RunArgs& a, Config config) {
  PagedRun r;
  r.config = std::move(config);
  r.op = a.op, r.q = a.q, r.out = a.out, r.lse_out = a.lse_out, r.sinks = a.sinks, r.explain = a.explain;
  if (!a.dtype.empty()) r.dtype = parse_dtype(a.dtype);
  r.options.causal = !a.no_causal;
  if (!a.window.empty()) r.options.sliding_window = parse_window(a.window);
  if (a.chunk_opt->count()) r.options.chunk_size = a.chunk;
  if (a.soft_cap_opt->count()) r.options.logits_soft_cap = a.soft_cap;
  const std::pair<bool, const char*> dense_only[] = {{!a.k.empty(), "--k"},
                                                     {!a.v.empty(), "--v"},
                                                     {!a.bias.empty(), "--bias"},
                                                     {!a.seg_q.empty(), "--segment-ids-q"},
                                                     {!a.weights_out.empty(), "--weights-out"},
                                                     {a.backward.requested(), "--dout"}};
  for (const auto& [given, flag] : dense_only)
    if (given) r.dense_only.push_back(flag);
  return r;
}

// --backend, --scale, --threads, --dtype: the call's own settings over the config's.
CallSettings call_settings(const RunArgs& a) {
  CallSettings s;
  if (!a.backend.empty()) s.backends = parse_backend_list(a.backend);
  if (a.scale_opt->count()) s.softmax_scale = a.scale;
  if (a.threads_opt->count()) s.num_threads = a.threads;
  if (!a.dtype.empty()) s.runtime_dtype = parse_dtype(a.dtype);
  return s;
}

int run(const RunArgs& a) {
  if (a.paged.requested()) {
    // (--dtype converts the inputs, not the call: a paged call runs in the cache's dtype.)
    CallSettings s = call_settings(a);
    s.runtime_dtype.reset();
    PagedRun r = paged_run(a, load_optional_config(a.config));
    set_call_settings(r.options, s);
    return run_paged(a.paged, r);
  }
  if (a.k.empty() || a.v.empty())
    throw Error(ErrorCode::invalid_argument,
                std::string(a.k.empty() ? "--k" : "--v") +
                    " is required (or, for --op ragged_paged, the paged inputs --k-pages, --v-pages, "
                    "--page-table, --cu-seqlens-q, --kv-lens)");
  check_backward_args(a.backward, !a.sinks.empty(), !a.bias.empty(), {a.out, a.lse_out, a.weights_out});
  const Attention attn = registry().get(a.op, load_optional_config(a.config));

  // Every output is reserved before any work (a bad path fails now) and appears only when all
  // were written (output_set.h): a failure leaves no file behind.
  OutputSet outs;
  const int out_file = outs.add(a.out, "--out");
  const int lse_file = a.lse_out.empty() ? -1 : outs.add(a.lse_out, "--lse-out");
  const int weights_file = a.weights_out.empty() ? -1 : outs.add(a.weights_out, "--weights-out");
  const std::vector<int> grad_files = reserve_gradient_outputs(a.backward, outs);

  // Inputs are read straight into the tensors the kernels read (read_npy: no copies).
  const Tensor q = read_npy(a.q), k = read_npy(a.k), v = read_npy(a.v);
  AttentionOptions opts;
  opts.causal = !a.no_causal;
  if (!a.window.empty()) opts.sliding_window = parse_window(a.window);
  if (a.chunk_opt->count()) opts.chunk_size = a.chunk;
  if (a.soft_cap_opt->count()) opts.logits_soft_cap = a.soft_cap;
  // The tensors the options view must outlive the call.
  std::optional<Tensor> sinks, bias, seg_q, seg_kv;
  if (!a.sinks.empty()) opts.sinks = (sinks = read_npy(a.sinks))->view();
  if (!a.bias.empty()) opts.bias = (bias = read_npy(a.bias))->view();
  if (!a.seg_q.empty()) opts.segment_ids_q = (seg_q = read_npy(a.seg_q))->view();
  if (!a.seg_kv.empty()) opts.segment_ids_kv = (seg_kv = read_npy(a.seg_kv))->view();
  opts.return_lse = lse_file >= 0 || a.backward.requested();  // the backward needs the lse
  opts.return_weights = weights_file >= 0;
  opts.profile = a.profile;
  set_call_settings(opts, call_settings(a));

  const AttentionOutput r = attn(q, k, v, opts);
  std::optional<GradientFiles> grads;  // computed before anything is written
  if (a.backward.requested()) grads = run_backward(attn, q, k, v, r, opts, a.backward);

  // The output keeps the runtime dtype (q's unless --dtype says otherwise); .npy has no bf16, so
  // bf16 is written as f32. Written straight from the result.
  write_npy(outs.fd(out_file), outs.name(out_file), r.out);
  if (lse_file >= 0) {
    if (!r.lse) throw Error(ErrorCode::internal, "the operator returned no lse although it was asked for");
    write_npy(outs.fd(lse_file), outs.name(lse_file), *r.lse);
  }
  if (opts.return_weights) {
    if (!r.attention_weights)
      throw Error(ErrorCode::internal, "the operator returned no weights although they were asked for");
    write_npy(outs.fd(weights_file), outs.name(weights_file), *r.attention_weights);
  }
  if (grads) write_gradients(*grads, outs, grad_files);
  outs.commit();
  if (a.explain) {
    std::cerr << r.decision.to_json() << std::endl;
    if (grads) std::cerr << grads->decision.to_json() << std::endl;
  }
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& root) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* app = root.add_subcommand("run", "Run one attention call on .npy inputs (layout BTHD)");
  app->add_option(
         "--op", a->op,
         "Operator name or alias (vanilla, blocksparse/splash, flash_attn2/flash, ragged_paged/paged)")
      ->required();
  app->add_option("--q", a->q, "Queries [B, Tq, Hq, D] (.npy); [N, Hq, D] for a paged run")->required();
  app->add_option("--k", a->k, "Keys [B, Tk, Hkv, D] (.npy); required unless the run is paged");
  app->add_option("--v", a->v, "Values [B, Tk, Hkv, Dv] (.npy); required unless the run is paged");
  app->add_option("--out", a->out, "Output [B, Tq, Hq, Dv] (.npy, written)")->required();
  app->add_option("--config", a->config, "YAML configuration; explicit flags override it");
  app->add_option("--backend", a->backend, "Backend to try first")
      ->check(CLI::IsMember({"auto", "native", "cpu", "gpu", "tpu"}));
  auto* causal = app->add_flag("--causal", a->causal, "Causal, bottom-right aligned (the default)");
  app->add_flag("--no-causal", a->no_causal, "Not causal")->excludes(causal);
  a->scale_opt = app->add_option("--scale", a->scale, "Softmax scale (default 1/sqrt(D))");
  app->add_option("--window", a->window, "Sliding window L,R: keys p-L..p+R")->type_name("L,R");
  a->chunk_opt = app->add_option("--chunk", a->chunk, "Chunked causal attention with chunks of N keys");
  a->soft_cap_opt = app->add_option("--soft-cap", a->soft_cap, "Logit soft cap: s = cap * tanh(s / cap)");
  app->add_option("--sinks", a->sinks, "Attention sinks, one logit per q head [Hq] (.npy)");
  app->add_option("--bias", a->bias, "Additive bias [B|1, Hq|1, Tq, Tk] (.npy)");
  auto* sq = app->add_option("--segment-ids-q", a->seg_q, "Segment ids of queries [B, Tq] (.npy)");
  auto* skv = app->add_option("--segment-ids-kv", a->seg_kv, "Segment ids of keys [B, Tk] (.npy)");
  sq->needs(skv);
  skv->needs(sq);
  app->add_option("--dtype", a->dtype, "Runtime dtype (bf16 output is written as f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app->add_option("--lse-out", a->lse_out, "Write the log-sum-exp [B, Hq, Tq] f32 (.npy)");
  app->add_option("--weights-out", a->weights_out, "Write the attention weights [B, Hq, Tq, Tk] f32 (.npy)");
  a->threads_opt =
      app->add_option("--threads", a->threads, "OpenMP threads (0 = default)")->check(CLI::NonNegativeNumber);
  app->add_flag("--explain", a->explain,
                "Print the dispatch decision as JSON, last line on stderr (with where the inputs lived, the "
                "bytes moved and, with --profile or ATTNOPS_PROFILE=1, the GPU timings; with --dout: the "
                "forward's, then the backward's)");
  app->add_flag("--profile", a->profile, "Time the call (GPU timestamps around upload, kernels, download)");
  add_backward_options(app, a->backward);
  add_paged_options(app, a->paged);
  return {app, [a] { return run(*a); }};
}

}  // namespace attnops::cli
