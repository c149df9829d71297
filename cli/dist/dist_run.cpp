// `attnops run --op ring|ulysses` on every rank of an mpirun job: the same flags and files as
// the single-process run. Rank 0 reads the inputs (and checks the outputs can be written) and
// sends each rank its shards in the operator's layout; every rank runs its part; rank 0 gathers
// out, lse and (with --dout) the gradients and writes them, all or nothing (cli/output_set.h).
// Comparing with `attnops run --op flash_attn2 ...` on the same files checks a distributed run.
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/dist/sequence_parallel.h"
#include "cli/dist/dist_commands.h"
#include "cli/dist/scatter.h"
#include "cli/npy.h"
#include "cli/output_set.h"
#include "cli/run_backward.h"
#include "cli/settings.h"

namespace attnops::cli {
namespace {

struct DistRunArgs {
  std::string op, q, k, v, out, config, backend, window, sinks, bias, seg_q, seg_kv, dtype, lse_out,
      weights_out, layout, local_op = "flash_attn2";
  bool causal = false, no_causal = false, explain = false, profile = false, stats = false;
  double scale = 0, soft_cap = 0;
  long long chunk = 0, progress_rows = 1024;
  int threads = 0;
  CLI::Option *scale_opt = nullptr, *soft_cap_opt = nullptr, *chunk_opt = nullptr, *threads_opt = nullptr;
  BackwardArgs backward;
};

// What rank 0 tells every rank before any shard moves: whether its checks passed, and the
// inputs' dtypes and shapes (a fixed-size record, one broadcast).
struct Header {
  std::int32_t ok = 1, code = 0;
  char message[1024] = {};
  std::int32_t dtype[7] = {};  // q, k, v, sinks, seg_q, seg_kv, dout
  std::int64_t shape[7][4] = {};
  std::int32_t rank[7] = {};  // 0: not given
};
enum Input { kQ, kK, kV, kSinks, kSegQ, kSegKv, kDout, kInputs };

TensorMeta meta_of(const Header& h, int i) {
  TensorMeta m;
  m.dtype = static_cast<DType>(h.dtype[i]);
  m.shape.assign(h.shape[i], h.shape[i] + h.rank[i]);
  return m;
}

void require_rank(const Tensor& t, int rank, const char* flag, const char* layout) {
  if (t.rank() != rank)
    throw Error(ErrorCode::shape_mismatch,
                std::string(flag) + ": expected " + layout + ", got " + shape_string(t.shape()));
}

// The shards cut the inputs along T: a length that disagrees with q's or k's must be refused here,
// by rank 0 before any shard moves, not by the scatter on a rank.
void require_shape(const Tensor& t, const std::vector<std::int64_t>& want, const char* flag,
                   const char* layout, const char* from) {
  if (t.shape() != want)
    throw Error(ErrorCode::shape_mismatch, std::string(flag) + ": expected " + layout + " = " +
                                               shape_string(want) + " (" + from + "), got " +
                                               shape_string(t.shape()));
}

Window parse_window(const std::string& text) {
  const auto parts = split(text, ',');
  if (parts.size() != 2)
    throw Error(ErrorCode::invalid_argument, "--window: expected L,R (two integers), got '" + text + "'");
  return Window{parse_integer(parts[0], "--window left"), parse_integer(parts[1], "--window right")};
}

int run(World& world, const DistRunArgs& a) {
  dist::Communicator& comm = world.comm();
  const int me = comm.rank();
  const bool root = me == 0;

  // Rank 0: argument checks, outputs reserved, inputs read; the verdict and shapes to everyone.
  Header h;
  std::unique_ptr<OutputSet> outs;
  int out_file = -1, lse_file = -1;
  std::vector<int> grad_files;
  std::optional<Tensor> in[kInputs];
  if (root) {
    try {
      if (!a.bias.empty())
        throw Error(ErrorCode::not_implemented,
                    "--bias: distributed attention takes no additive bias (it is O(T^2) per rank); run --op "
                    "flash_attn2 in one process");
      if (!a.weights_out.empty())
        throw Error(ErrorCode::not_implemented, "--weights-out: distributed attention returns no weights");
      check_backward_args(a.backward, !a.sinks.empty(), false, {a.out, a.lse_out});
      outs = std::make_unique<OutputSet>();
      out_file = outs->add(a.out, "--out");
      if (!a.lse_out.empty()) lse_file = outs->add(a.lse_out, "--lse-out");
      grad_files = reserve_gradient_outputs(a.backward, *outs);
      in[kQ] = read_npy(a.q), in[kK] = read_npy(a.k), in[kV] = read_npy(a.v);
      require_rank(*in[kQ], 4, "--q", "[B, Tq, Hq, D]");
      require_rank(*in[kK], 4, "--k", "[B, Tk, Hkv, D]");
      require_rank(*in[kV], 4, "--v", "[B, Tk, Hkv, Dv]");
      if (in[kV]->dim(1) != in[kK]->dim(1))
        throw Error(ErrorCode::shape_mismatch, "--v: " + shape_string(in[kV]->shape()) +
                                                   " has another Tk than --k " +
                                                   shape_string(in[kK]->shape()));
      if (!a.sinks.empty()) in[kSinks] = read_npy(a.sinks);
      const Tensor &q = *in[kQ], &k = *in[kK], &v = *in[kV];
      if (!a.seg_q.empty()) {
        in[kSegQ] = read_npy(a.seg_q), in[kSegKv] = read_npy(a.seg_kv);
        require_shape(*in[kSegQ], {q.dim(0), q.dim(1)}, "--segment-ids-q", "[B, Tq]", "from --q");
        require_shape(*in[kSegKv], {k.dim(0), k.dim(1)}, "--segment-ids-kv", "[B, Tk]", "from --k");
      }
      if (a.backward.requested()) {
        in[kDout] = read_npy(a.backward.dout);
        require_shape(*in[kDout], {q.dim(0), q.dim(1), q.dim(2), v.dim(3)}, "--dout", "[B, Tq, Hq, Dv]",
                      "from --q and --v");
      }
      for (int i = 0; i < kInputs; ++i)
        if (in[i]) {
          h.dtype[i] = static_cast<std::int32_t>(in[i]->dtype());
          h.rank[i] = in[i]->rank();
          for (int d = 0; d < in[i]->rank(); ++d) h.shape[i][d] = in[i]->dim(d);
        }
    } catch (const Error& e) {
      h.ok = 0;
      h.code = static_cast<std::int32_t>(e.code());
      std::strncpy(h.message, e.what(), sizeof h.message - 1);
    }
  }
  comm.broadcast(&h, sizeof h, 0);
  if (!h.ok) throw dist::AgreedError(static_cast<ErrorCode>(h.code), h.message);

  CallSettings o;
  if (!a.backend.empty()) o.backends = parse_backend_list(a.backend);
  if (a.scale_opt->count()) o.softmax_scale = a.scale;
  if (a.threads_opt->count()) o.num_threads = a.threads;
  if (!a.dtype.empty()) o.runtime_dtype = parse_dtype(a.dtype);
  Config config = load_optional_config(a.config);
  apply_to_config(config, o);
  dist::DistSettings settings;
  if (!a.layout.empty()) settings.layout = dist::parse_layout(a.layout);
  settings.local_operator = a.local_op;
  settings.progress_rows = a.progress_rows;
  const dist::DistributedAttention attn = dist::get(a.op, config, settings);

  AttentionOptions opts;
  opts.causal = !a.no_causal;
  if (!a.window.empty()) opts.sliding_window = parse_window(a.window);
  if (a.chunk_opt->count()) opts.chunk_size = a.chunk;
  if (a.soft_cap_opt->count()) opts.logits_soft_cap = a.soft_cap;
  opts.profile = a.profile;
  const std::int64_t Tq = h.shape[kQ][1], Tk = h.shape[kK][1];
  const dist::ShardLayout ql = attn.layout_for(opts, Tq, comm.size()),
                          kl = attn.layout_for(opts, Tk, comm.size());

  // Shards out, options to everyone.
  const auto ptr = [&](int i) { return in[i] ? &*in[i] : nullptr; };
  const Tensor q = scatter_shard(comm, ptr(kQ), meta_of(h, kQ), ql, 1, 1);
  const Tensor k = scatter_shard(comm, ptr(kK), meta_of(h, kK), kl, 1, 2);
  const Tensor v = scatter_shard(comm, ptr(kV), meta_of(h, kV), kl, 1, 3);
  std::optional<Tensor> sinks, seg_q, seg_kv, dout;
  if (h.rank[kSinks]) opts.sinks = (sinks = broadcast_tensor(comm, ptr(kSinks), meta_of(h, kSinks)))->view();
  if (h.rank[kSegQ]) {
    opts.segment_ids_q = (seg_q = scatter_shard(comm, ptr(kSegQ), meta_of(h, kSegQ), ql, 1, 4))->view();
    opts.segment_ids_kv = (seg_kv = scatter_shard(comm, ptr(kSegKv), meta_of(h, kSegKv), kl, 1, 5))->view();
  }
  if (h.rank[kDout]) dout = scatter_shard(comm, ptr(kDout), meta_of(h, kDout), ql, 1, 6);
  for (auto& t : in) t.reset();  // rank 0 keeps no second copy of the inputs

  const dist::DistOutput r = attn(comm, q, k, v, opts);
  std::optional<dist::DistGradients> g;
  if (dout) g = attn.backward(comm, q, k, v, r, *dout, opts);

  // Results to rank 0, which writes them.
  const std::optional<Tensor> out = gather_shards(comm, r.output.out, ql, 1, 11);
  std::optional<Tensor> lse;
  if (lse_file >= 0 || a.lse_out.size()) lse = gather_shards(comm, *r.output.lse, ql, 2, 12);
  GradientFiles grads;
  if (g) {
    const auto add = [&](const std::string& path, const Tensor& t, const dist::ShardLayout* l, int tag) {
      std::optional<Tensor> full = l ? gather_shards(comm, t, *l, 1, tag) : std::optional<Tensor>(t);
      if (root && !path.empty()) grads.files.emplace_back(path, Tensor::copy_of(*full, DType::f32));
    };
    // The order of reserve_gradient_outputs: dq, dk, dv, dsinks.
    if (!a.backward.dq_out.empty()) add(a.backward.dq_out, g->gradients.dq, &ql, 13);
    if (!a.backward.dk_out.empty()) add(a.backward.dk_out, g->gradients.dk, &kl, 14);
    if (!a.backward.dv_out.empty()) add(a.backward.dv_out, g->gradients.dv, &kl, 15);
    if (!a.backward.dsinks_out.empty()) add(a.backward.dsinks_out, *g->gradients.dsinks, nullptr, 0);
    grads.decision = g->gradients.decision;
  }
  if (a.stats)  // every rank's summary, in rank order
    for (int i = 0; i < comm.size(); ++i) {
      if (i == me) {
        std::cerr << "rank " << me << ": " << r.stats.summary() << "\n";
        if (g) std::cerr << "rank " << me << ": " << g->stats.summary() << "\n";
        std::cerr.flush();
      }
      comm.barrier();
    }
  if (!root) return 0;
  write_npy(outs->fd(out_file), outs->name(out_file), *out);
  if (lse_file >= 0) write_npy(outs->fd(lse_file), outs->name(lse_file), *lse);
  if (g) write_gradients(grads, *outs, grad_files);
  outs->commit();
  if (a.explain) {
    std::cerr << r.output.decision.to_json() << std::endl;
    if (g) std::cerr << grads.decision.to_json() << std::endl;
  }
  return 0;
}

}  // namespace

DistCommand add_dist_run_command(CLI::App& root) {
  auto a = std::make_shared<DistRunArgs>();
  CLI::App* app =
      root.add_subcommand("run", "Distributed attention on .npy inputs (under mpirun; layout BTHD)");
  app->add_option("--op", a->op, "ring or ulysses")->required()->check(CLI::IsMember({"ring", "ulysses"}));
  app->add_option("--q", a->q, "Queries [B, Tq, Hq, D] (.npy, read by rank 0)")->required();
  app->add_option("--k", a->k, "Keys [B, Tk, Hkv, D] (.npy)")->required();
  app->add_option("--v", a->v, "Values [B, Tk, Hkv, Dv] (.npy)")->required();
  app->add_option("--out", a->out, "Output [B, Tq, Hq, Dv] (.npy, written by rank 0)")->required();
  app->add_option("--config", a->config,
                  "YAML configuration (operators.ring / operators.ulysses configure the local operator)");
  app->add_option("--backend", a->backend, "Backend of the local operator")
      ->check(CLI::IsMember({"auto", "native", "cpu", "gpu", "tpu"}));
  auto* causal = app->add_flag("--causal", a->causal, "Causal, bottom-right aligned (the default)");
  app->add_flag("--no-causal", a->no_causal, "Not causal")->excludes(causal);
  a->scale_opt = app->add_option("--scale", a->scale, "Softmax scale (default 1/sqrt(D))");
  app->add_option("--window", a->window, "Sliding window L,R: keys p-L..p+R")->type_name("L,R");
  a->chunk_opt = app->add_option("--chunk", a->chunk, "Chunked causal attention with chunks of N keys");
  a->soft_cap_opt = app->add_option("--soft-cap", a->soft_cap, "Logit soft cap: s = cap * tanh(s / cap)");
  app->add_option("--sinks", a->sinks, "Attention sinks, one logit per q head [Hq] (.npy)");
  app->add_option("--bias", a->bias, "Not supported distributed (an error)");
  auto* sq = app->add_option("--segment-ids-q", a->seg_q, "Segment ids of queries [B, Tq] (.npy)");
  auto* skv = app->add_option("--segment-ids-kv", a->seg_kv, "Segment ids of keys [B, Tk] (.npy)");
  sq->needs(skv);
  skv->needs(sq);
  app->add_option("--dtype", a->dtype, "Runtime dtype (bf16 output is written as f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app->add_option("--lse-out", a->lse_out, "Write the log-sum-exp [B, Hq, Tq] f32 (.npy)");
  app->add_option("--weights-out", a->weights_out, "Not supported distributed (an error)");
  a->threads_opt = app->add_option("--threads", a->threads, "OpenMP threads per rank (0 = default)")
                       ->check(CLI::NonNegativeNumber);
  app->add_flag(
      "--explain", a->explain,
      "Print rank 0's decision as JSON, last line on stderr (the layout, the local kernel, per-step "
      "compute / wait times and bytes; with --dout the backward's follows)");
  app->add_flag("--profile", a->profile, "Time the local calls");
  app->add_option("--layout", a->layout,
                  "Shard layout (default: zigzag for causal without a window, else contiguous)")
      ->check(CLI::IsMember({"zigzag", "contiguous"}));
  app->add_option("--local-op", a->local_op, "The operator each rank runs locally (default flash_attn2)");
  app->add_option("--progress-rows", a->progress_rows,
                  "ring: query rows per local call between progress calls (0: one call per block)")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--stats", a->stats, "Print every rank's per-step compute / wait / bytes on stderr");
  add_backward_options(app, a->backward);
  return {app, [a](World& w) { return run(w, *a); }};
}

}  // namespace attnops::cli
