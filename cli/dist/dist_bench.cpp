// `mpirun -np P attnops bench --distributed`: the distributed operators against one process on
// the same machine, and the ring's cost model (attnops/dist/cost_model.h).
//
// For each shape (strong scaling: T is the whole sequence; --weak: T tokens per rank, the whole
// sequence P * T): rank 0 first times the local operator on the whole problem with P threads
// ("1 process x P threads") while the other ranks sleep; then every rank times the distributed
// operator with --threads threads (default 1: "P ranks x 1 thread"), the call's wall time being
// the slowest rank's. Forward, and forward + backward. Each row gives the median over --repeats,
// the ratio to the one-process time (1.0 = as fast; P ranks on P cores aim at >= 0.85), the
// per-rank busy time (the local calls and merges: max / mean shows the layout's balance), the
// exposed wait (time blocked on messages after the step's compute) and the bytes each rank sent.
// A ping-pong between ranks 0 and 1 measures the latency and bandwidth of the transport; with
// the compute rate of the one-process run per thread they calibrate the cost model, whose
// predicted ring step time is printed next to the measured one. --project prints the model's
// efficiency for P = 8 .. 1024 over shared memory, 25 / 100 GbE and InfiniBand, and the fewest
// tokens per rank that hide the communication. Runs with more ranks (or threads) than cores are
// correctness runs only: their times say nothing.
#include "cli/dist/dist_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/dist/cost_model.h"
#include "attnops/dist/sequence_parallel.h"
#include "benchkit/bench_spec.h"
#include "cli/dist/dist_commands.h"
#include "cli/inputs.h"
#include "cli/settings.h"

namespace attnops::cli {

using namespace benchkit;  // the benchmark harness's specs, timers and yardsticks
namespace {

using Clock = std::chrono::steady_clock;
double since_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
double cpu_ms() {  // this process, every thread
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The shards of one rank, generated directly (timings do not depend on the values).
struct Inputs {
  Tensor q, k, v, dout;
};
Inputs make_shards(const BenchShape& s, std::int64_t Tq_rank, std::int64_t Tk_rank, DType dtype,
                   std::uint64_t seed) {
  return {random_tensor(dtype, {s.B, Tq_rank, s.Hq, s.D}, seed),
          random_tensor(dtype, {s.B, Tk_rank, s.Hkv, s.D}, seed + 1),
          random_tensor(dtype, {s.B, Tk_rank, s.Hkv, s.D}, seed + 2),
          random_tensor(dtype, {s.B, Tq_rank, s.Hq, s.D}, seed + 3)};
}

Config config_with_threads(const DistBenchArgs& a, int threads) {
  Config c = load_optional_config(a.config);
  CallSettings o;
  o.num_threads = threads;
  if (!a.backend.empty()) o.backends = parse_backend_list(a.backend);
  apply_to_config(c, o);
  return c;
}

// 1 process x P threads on the whole problem (rank 0), the other ranks asleep.
Timing baseline(dist::Communicator& comm, const DistBenchArgs& a, const BenchShape& s, std::int64_t T,
                DType dtype, const AttentionOptions& opts) {
  Timing t;
  if (comm.rank() == 0) {
    const int threads = a.baseline_threads > 0 ? a.baseline_threads : comm.size();
    const Attention attn = registry().get(a.local_op, config_with_threads(a, threads));
    const Inputs in = make_shards(s, T, T, dtype, 100);
    AttentionOptions o = opts;
    o.return_lse = true;
    AttentionOutput r = attn(in.q, in.k, in.v, o);  // warm-up
    (void)attn.backward(in.q, in.k, in.v, r, in.dout, o);
    std::vector<double> f, fb, fc, fbc;
    for (int i = 0; i < a.repeats; ++i) {
      auto t0 = Clock::now();
      double c0 = cpu_ms();
      r = attn(in.q, in.k, in.v, o);
      f.push_back(since_ms(t0));
      fc.push_back(cpu_ms() - c0);
      if (a.backward) {
        t0 = Clock::now();
        c0 = cpu_ms();
        (void)attn.backward(in.q, in.k, in.v, r, in.dout, o);
        fb.push_back(f.back() + since_ms(t0));
        fbc.push_back(fc.back() + cpu_ms() - c0);
      }
    }
    t.fwd_ms = median(f);
    t.fwd_bwd_ms = median(fb);
    t.fwd_cpu_ms = median(fc);
    t.fwd_bwd_cpu_ms = median(fbc);
    t.kernel = r.decision.op + ":" + r.decision.run.kernel;
  }
  comm.quiet_barrier();
  double all[4] = {t.fwd_ms, t.fwd_bwd_ms, t.fwd_cpu_ms, t.fwd_bwd_cpu_ms};
  comm.broadcast(all, sizeof all, 0);
  t.fwd_ms = all[0], t.fwd_bwd_ms = all[1], t.fwd_cpu_ms = all[2], t.fwd_bwd_cpu_ms = all[3];
  return t;
}

// Per-rank numbers of the last repeat, gathered on every rank.
struct RankNumbers {
  double busy_fwd = 0, busy_bwd = 0, wait_fwd = 0, wait_bwd = 0, sent = 0, work = 0;
  double step_ms[kMaxModelSteps] = {};  // forward: compute + wait of each step (ring)
  double step_compute[kMaxModelSteps] = {};
};

void run_distributed(dist::Communicator& comm, const DistBenchArgs& a, const BenchShape& s, std::int64_t T,
                     DType dtype, const AttentionOptions& opts, const std::string& op,
                     std::optional<dist::Layout> layout, DistRow& row) {
  dist::DistSettings st;
  st.layout = layout;
  st.local_operator = a.local_op;
  st.progress_rows = a.progress_rows;
  const dist::DistributedAttention attn = dist::get(op, config_with_threads(a, a.threads), st);
  const dist::ShardLayout l = attn.layout_for(opts, T, comm.size());
  row.layout = std::string(dist::layout_name(l.layout()));
  const std::int64_t n = l.shard_length(comm.rank());
  const Inputs in = make_shards(s, n, n, dtype, 200 + static_cast<std::uint64_t>(comm.rank()) * 10);
  dist::DistOutput r = attn(comm, in.q, in.k, in.v, opts);  // warm-up
  dist::DistGradients g;
  if (a.backward) g = attn.backward(comm, in.q, in.k, in.v, r, in.dout, opts);
  std::vector<double> f, fb, fc, fbc;
  for (int i = 0; i < a.repeats; ++i) {
    comm.barrier();
    auto t0 = Clock::now();
    double c0 = cpu_ms();
    r = attn(comm, in.q, in.k, in.v, opts);
    double ms[2] = {since_ms(t0), NAN}, cpu[2] = {cpu_ms() - c0, NAN};
    if (a.backward) {
      t0 = Clock::now();
      c0 = cpu_ms();
      g = attn.backward(comm, in.q, in.k, in.v, r, in.dout, opts);
      ms[1] = ms[0] + since_ms(t0);
      cpu[1] = cpu[0] + cpu_ms() - c0;
    }
    comm.allreduce_max(ms, a.backward ? 2 : 1);   // a call lasts as long as its slowest rank
    comm.allreduce_sum(cpu, a.backward ? 2 : 1);  // and costs every rank's CPU time
    f.push_back(ms[0]);
    fc.push_back(cpu[0]);
    if (a.backward) fb.push_back(ms[1]), fbc.push_back(cpu[1]);
  }
  row.dist.fwd_ms = median(f);
  row.dist.fwd_bwd_ms = median(fb);
  row.dist.fwd_cpu_ms = median(fc);
  row.dist.fwd_bwd_cpu_ms = median(fbc);
  row.dist.kernel = r.output.decision.run.kernel;
  RankNumbers mine;
  mine.busy_fwd = r.stats.compute_ms;
  mine.wait_fwd = r.stats.wait_ms;
  mine.sent = static_cast<double>(r.stats.bytes_sent);
  for (const auto& step : r.stats.steps) mine.work += step.visible_pairs;
  if (a.backward) {
    mine.busy_bwd = g.stats.compute_ms;
    mine.wait_bwd = g.stats.wait_ms;
    mine.sent += static_cast<double>(g.stats.bytes_sent);
  }
  for (std::size_t i = 0; i < r.stats.steps.size() && i < kMaxModelSteps; ++i) {
    mine.step_ms[i] = r.stats.steps[i].compute_ms + r.stats.steps[i].wait_ms;
    mine.step_compute[i] = r.stats.steps[i].compute_ms;
  }
  std::vector<RankNumbers> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(&mine, sizeof mine, all.data());
  const auto max_mean = [&](double RankNumbers::*field) {
    double mx = 0, sum = 0;
    for (const RankNumbers& x : all) mx = std::max(mx, x.*field), sum += x.*field;
    return std::pair<double, double>{mx, sum / static_cast<double>(all.size())};
  };
  std::tie(row.busy_fwd_max, row.busy_fwd_mean) = max_mean(&RankNumbers::busy_fwd);
  std::tie(row.busy_bwd_max, row.busy_bwd_mean) = max_mean(&RankNumbers::busy_bwd);
  row.wait_fwd_max = max_mean(&RankNumbers::wait_fwd).first;
  row.wait_bwd_max = max_mean(&RankNumbers::wait_bwd).first;
  row.sent_mean = max_mean(&RankNumbers::sent).second;
  std::tie(row.work_max, row.work_mean) = max_mean(&RankNumbers::work);
  row.steps = static_cast<int>(std::min<std::size_t>(r.stats.steps.size(), kMaxModelSteps));
  row.bytes_fwd_step = 0;
  for (const auto& st2 : r.stats.steps)
    row.bytes_fwd_step = std::max(row.bytes_fwd_step, static_cast<double>(st2.bytes_sent));
  // Measured ring step: the slowest rank's compute + exposed wait, averaged over the steps.
  double step = 0, comp = 0;
  for (int i = 0; i < row.steps; ++i) {
    double m = 0, c = 0;
    for (const RankNumbers& x : all) m = std::max(m, x.step_ms[i]), c = std::max(c, x.step_compute[i]);
    step += m, comp += c;
  }
  row.step_ms = row.steps > 0 ? step / row.steps : NAN;
  row.step_compute_ms = row.steps > 0 ? comp / row.steps : NAN;
}

// Ping-pong between ranks 0 and 1 (the others asleep): latency (8 B) and bandwidth (16 MiB).
void ping_pong(dist::Communicator& comm, double& latency_us, double& GBps) {
  latency_us = GBps = NAN;
  if (comm.size() < 2) return;
  if (comm.rank() <= 1) {
    const int peer = 1 - comm.rank();
    const auto round_trips = [&](std::size_t bytes, int n) {
      std::vector<char> buf(bytes);
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        if (comm.rank() == 0) {
          comm.isend(buf.data(), bytes, peer, 900)->wait();
          comm.irecv(buf.data(), bytes, peer, 901)->wait();
        } else {
          comm.irecv(buf.data(), bytes, peer, 900)->wait();
          comm.isend(buf.data(), bytes, peer, 901)->wait();
        }
      }
      return since_ms(t0) / 1e3 / (2.0 * n);  // one way, seconds
    };
    round_trips(8, 20);
    const double small = round_trips(8, 200);
    const std::size_t big = std::size_t{16} << 20;
    round_trips(big, 2);
    const double large = round_trips(big, 8);
    latency_us = small * 1e6;
    GBps = static_cast<double>(big) / std::max(large - small, 1e-9) / 1e9;
  }
  comm.quiet_barrier();
  double v[2] = {latency_us, GBps};
  comm.broadcast(v, sizeof v, 0);
  latency_us = v[0], GBps = v[1];
}

int run(World& world, const DistBenchArgs& a) {
  dist::Communicator& comm = world.comm();
  const int P = comm.size();
  const bool root = comm.rank() == 0;
  const DType dtype = parse_dtype(a.dtype).value_or(DType::f32);
  AttentionOptions opts;
  opts.causal = !a.no_causal;
  std::vector<std::string> ops = split(a.ops, ',');
  std::vector<std::string> layouts = a.layouts.empty() ? std::vector<std::string>{} : split(a.layouts, ',');
  if (layouts.empty())
    layouts = opts.causal ? std::vector<std::string>{"zigzag", "contiguous"}
                          : std::vector<std::string>{"contiguous"};
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool oversubscribed = static_cast<unsigned>(P * std::max(a.threads, 1)) > cores;

  DistBenchReport report;
  report.ranks = P;
  report.threads = std::max(a.threads, 1);
  report.transport = comm.describe();
  report.oversubscribed = oversubscribed;
  report.causal = opts.causal;
  ping_pong(comm, report.latency_us, report.GBps);
  for (const BenchShape& s0 : parse_bench_shapes(a.shapes)) {
    BenchShape s = s0;
    const std::int64_t T = a.weak ? s.Tq * P : s.Tq;
    s.Tq = s.Tk = T;
    const Timing base = a.baseline && P > 1 ? baseline(comm, a, s, T, dtype, opts) : Timing{};
    for (const std::string& op : ops)
      for (const std::string& lay : op == "ring" ? layouts : std::vector<std::string>{""}) {
        DistRow row;
        row.op = op;
        row.shape = s;
        row.dtype = dtype;
        row.T = T;
        row.base = base;
        run_distributed(comm, a, s, T, dtype, opts, op, lay.empty() ? std::nullopt : dist::parse_layout(lay),
                        row);
        if (root) print_row(std::cout, report, row, a.backward);
        report.rows.push_back(row);
      }
  }
  if (root) {
    print_model(std::cout, report, a);
    if (!a.csv.empty()) write_csv(a.csv, report);
  }
  return 0;
}

}  // namespace

DistCommand add_dist_bench_command(CLI::App& root) {
  auto a = std::make_shared<DistBenchArgs>();
  CLI::App* app = root.add_subcommand("bench", "Distributed attention against one process (under mpirun)");
  app->add_flag("--distributed", a->distributed, "The distributed benchmark (this one)")->required();
  app->add_option("--shapes", a->shapes, "B,H,T,D[,Hkv];... (T: the whole sequence; with --weak: per rank)");
  app->add_option("--ops", a->ops, "ring,ulysses");
  app->add_option("--layouts", a->layouts, "ring layouts to time (default: zigzag,contiguous for causal)");
  auto* causal = app->add_flag("--causal", a->causal, "Causal (the default)");
  app->add_flag("--no-causal", a->no_causal, "Not causal")->excludes(causal);
  app->add_flag("!--no-backward", a->backward, "Time the forward only");
  app->add_flag("--weak", a->weak, "Weak scaling: T tokens per rank");
  app->add_option("--repeats", a->repeats, "Timed runs per row (median)")->check(CLI::PositiveNumber);
  app->add_option("--threads", a->threads, "OpenMP threads per rank (default 1)")->check(CLI::PositiveNumber);
  app->add_option("--baseline-threads", a->baseline_threads,
                  "Threads of the one-process baseline (default P)");
  app->add_flag("!--no-baseline", a->baseline, "Skip the one-process baseline");
  app->add_option("--local-op", a->local_op, "The local operator (default flash_attn2)");
  app->add_option("--backend", a->backend, "Backend of the local operator (default auto)");
  app->add_option("--config", a->config, "YAML configuration");
  app->add_option("--dtype", a->dtype, "f32 | f16 | bf16")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app->add_option("--progress-rows", a->progress_rows,
                  "ring: query rows per local call between progress calls");
  app->add_flag("--project", a->project, "Print the cost model's projection to P = 8 .. 1024");
  app->add_option("--project-tokens", a->project_tokens,
                  "Whole-sequence length of the projection (default 1048576)");
  app->add_option("--project-gflops", a->project_gflops,
                  "Per-rank GFLOP/s of the projection (default: calibrated)");
  app->add_option("--csv", a->csv, "Also write the rows as CSV");
  return {app, [a](World& w) { return run(w, *a); }};
}

}  // namespace attnops::cli
