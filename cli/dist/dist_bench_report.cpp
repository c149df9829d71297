#include <cstdio>
#include <fstream>

#include "attnops/dist/cost_model.h"
#include "attnops/error.h"
#include "cli/dist/dist_bench.h"

namespace attnops::cli {

namespace {

std::string f(const char* fmt, double v) {
  if (std::isnan(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

double visible_pairs(std::int64_t T, bool causal) {
  const double t = static_cast<double>(T);
  return causal ? t * (t + 1) / 2 : t * t;
}

double forward_flops(const DistRow& row, bool causal) {
  const benchkit::BenchShape& s = row.shape;
  return visible_pairs(row.T, causal) * static_cast<double>(s.B * s.Hq) * 2.0 * static_cast<double>(2 * s.D);
}

dist::RingShape ring_shape(const DistRow& row, bool causal, bool backward) {
  dist::RingShape s;
  s.B = row.shape.B, s.Hq = row.shape.Hq, s.Hkv = row.shape.Hkv, s.D = s.Dv = row.shape.D;
  s.causal = causal;
  s.backward = backward;
  s.elem_bytes = static_cast<std::int64_t>(dtype_size(row.dtype));
  return s;
}

// Per-rank GFLOP/s: from the one-process run (per thread, times the ranks' threads) when there
// is one, else from the distributed run's own busy time.
struct Rates {
  double fwd = NAN, bwd = NAN;
  std::string source;
};
Rates calibrate(const DistBenchReport& r, const DistRow& row, int baseline_threads) {
  Rates c;
  const double fl = forward_flops(row, r.causal);
  if (!std::isnan(row.base.fwd_ms)) {
    const double thr = baseline_threads > 0 ? baseline_threads : r.ranks;
    c.fwd = fl / (row.base.fwd_ms * 1e-3) / 1e9 / thr * r.threads;
    c.bwd = 2.5 * fl / ((row.base.fwd_bwd_ms - row.base.fwd_ms) * 1e-3) / 1e9 / thr * r.threads;
    c.source = "one-process run";
  } else if (row.busy_fwd_mean > 0) {
    c.fwd = fl / (row.busy_fwd_mean * r.ranks * 1e-3) / 1e9;
    c.bwd = row.busy_bwd_mean > 0 ? 2.5 * fl / (row.busy_bwd_mean * r.ranks * 1e-3) / 1e9 : NAN;
    c.source = "the ring's busy time";
  }
  return c;
}

}  // namespace

void print_row(std::ostream& os, const DistBenchReport& r, const DistRow& row, bool backward) {
  static bool header = false;
  if (!header) {
    header = true;
    os << "# attnops bench --distributed: " << r.ranks << " ranks x " << r.threads << " thread(s) ("
       << r.transport << ") against 1 process x " << r.ranks << " threads on the whole problem\n";
    if (r.oversubscribed)
      os << "# more ranks x threads than cores: times are not meaningful (correctness run)\n";
    os << "# ratio = one-process time / distributed time (wall; >= 0.85 is the target); cpu = the same with "
          "process "
          "CPU time summed over the ranks (less sensitive to other jobs);\n# busy = local calls and merges "
          "per rank, "
          "work = visible (q,k) pairs per rank (max/mean: the layout's balance); wait = exposed wait of the "
          "slowest "
          "rank\n";
    os << "op       layout      shape                  fwd_ms    1p_ms  ratio    cpu  fwd+bwd_ms     1p_ms  "
          "ratio    "
          "cpu  busy_max/mean(f,b)  work_max/mean  wait_ms(f,b)  MiB_sent/rank\n";
  }
  char line[640];
  std::snprintf(
      line, sizeof line, "%-8s %-11s %-20s %8s %8s %6s %6s %11s %9s %6s %6s %9s %9s %14s %6s %6s %14s\n",
      row.op.c_str(), row.layout.c_str(), row.shape.label().c_str(), f("%.1f", row.dist.fwd_ms).c_str(),
      f("%.1f", row.base.fwd_ms).c_str(), f("%.3f", row.base.fwd_ms / row.dist.fwd_ms).c_str(),
      f("%.3f", row.base.fwd_cpu_ms / row.dist.fwd_cpu_ms).c_str(),
      f("%.1f", backward ? row.dist.fwd_bwd_ms : NAN).c_str(), f("%.1f", row.base.fwd_bwd_ms).c_str(),
      f("%.3f", row.base.fwd_bwd_ms / row.dist.fwd_bwd_ms).c_str(),
      f("%.3f", row.base.fwd_bwd_cpu_ms / row.dist.fwd_bwd_cpu_ms).c_str(),
      f("%.3f", row.busy_fwd_max / row.busy_fwd_mean).c_str(),
      f("%.3f", backward ? row.busy_bwd_max / row.busy_bwd_mean : NAN).c_str(),
      f("%.3f", row.work_max / row.work_mean).c_str(), f("%.1f", row.wait_fwd_max).c_str(),
      f("%.1f", backward ? row.wait_bwd_max : NAN).c_str(), f("%.1f", row.sent_mean / (1 << 20)).c_str());
  os << line << std::flush;
}

void print_model(std::ostream& os, const DistBenchReport& r, const DistBenchArgs& a) {
  os << "\n# ring cost model: t_step = max(t_compute, alpha + bytes / bandwidth) "
        "(attnops/dist/cost_model.h)\n";
  os << "# transport, ping-pong ranks 0 <-> 1: latency " << f("%.2f", r.latency_us) << " us, bandwidth "
     << f("%.2f", r.GBps) << " GB/s\n";
  const DistRow* ref = nullptr;
  os << "# model A: F from the one-process run (a prediction); model B: F from this run's own compute "
        "(checks the "
        "communication part: is the wait as hidden as the model says)\n";
  os << "op   layout      shape                   Tl   MiB/step  F_fwd(GF/s)  model_A_ms  measured_step_ms "
        "(compute)  "
        "measured/A  model_B_ms  measured/B\n";
  for (const DistRow& row : r.rows) {
    if (row.op != "ring") continue;
    const Rates c = calibrate(r, row, a.baseline_threads);
    const double Tl = static_cast<double>(row.T) / r.ranks;
    const dist::Link shm{"shm", r.latency_us, r.GBps, true};
    const bool balanced = row.layout == "zigzag" || !r.causal;
    double model = NAN, own = NAN;
    const dist::RingShape shape = ring_shape(row, r.causal, false);
    if (!std::isnan(c.fwd) && !std::isnan(r.GBps))
      model = dist::ring_step(shape, Tl, c.fwd, shm).step_s * 1e3;
    if (row.step_compute_ms > 0 && !std::isnan(r.GBps)) {
      // The rate at which this run's steps computed (the model's pairs per step).
      const double step_flops = dist::ring_step(shape, Tl, 1.0, shm).compute_s * 1e9;
      own = dist::ring_step(shape, Tl, step_flops / (row.step_compute_ms * 1e-3) / 1e9, shm).step_s * 1e3;
    }
    char line[400];
    std::snprintf(line, sizeof line, "ring %-11s %-22s %5.0f %9s %12s %11s %16s (%s) %11s %11s %11s%s\n",
                  row.layout.c_str(), row.shape.label().c_str(), Tl,
                  f("%.2f", row.bytes_fwd_step / (1 << 20)).c_str(), f("%.1f", c.fwd).c_str(),
                  f("%.1f", model).c_str(), f("%.1f", row.step_ms).c_str(),
                  f("%.1f", row.step_compute_ms).c_str(), f("%.3f", row.step_ms / model).c_str(),
                  f("%.1f", own).c_str(), f("%.3f", row.step_ms / own).c_str(),
                  balanced ? "" : "  (unbalanced layout: the model assumes equal steps)");
    os << line;
    if (!ref && balanced && !std::isnan(c.fwd)) ref = &row;
  }
  if (!a.project) return;
  if (!ref) {
    os << "# --project: no balanced ring row to calibrate from\n";
    return;
  }
  const Rates c = calibrate(r, *ref, a.baseline_threads);
  const double Ff = a.project_gflops > 0 ? a.project_gflops : c.fwd;
  const double Fb = a.project_gflops > 0 ? a.project_gflops : c.bwd;
  const auto links =
      dist::standard_links(std::isnan(r.latency_us) ? 1.0 : r.latency_us, std::isnan(r.GBps) ? 5.0 : r.GBps);
  os << "\n# projection (" << (a.project_gflops > 0 ? "given" : "calibrated from " + c.source)
     << "): " << ref->shape.label().substr(0, ref->shape.label().find(" T")) << " D" << ref->shape.D << ", "
     << (r.causal ? "causal zigzag" : "non-causal") << ", per rank " << f("%.1f", Ff) << " GFLOP/s forward, "
     << f("%.1f", Fb) << " backward; links other than shared memory are typical figures, not measured\n";
  os << "# fewest tokens per rank whose compute hides a step's communication:\n";
  for (const dist::Link& l : links) {
    char line[256];
    std::snprintf(line, sizeof line, "#   %-26s (%5.1f us, %6.2f GB/s): fwd %8.0f  fwd+bwd %8.0f\n",
                  l.name.c_str(), l.latency_us, l.bandwidth_GBps,
                  dist::min_tokens_to_hide(ring_shape(*ref, r.causal, false), Ff, l),
                  std::isnan(Fb) ? NAN : dist::min_tokens_to_hide(ring_shape(*ref, r.causal, true), Fb, l));
    os << line;
  }
  const double T = a.project_tokens;
  os << "# strong scaling of T = " << f("%.0f", T)
     << " tokens: ring efficiency (fraction of the ideal P-fold speed-up), "
     << "forward / forward+backward\n";
  os << "    P  tokens/rank";
  for (const dist::Link& l : links) {
    char h[64];
    std::snprintf(h, sizeof h, "  %21s", l.name.substr(0, 21).c_str());
    os << h;
  }
  os << "\n";
  for (int P = 8; P <= 1024; P *= 2) {
    char line[64];
    std::snprintf(line, sizeof line, "%5d  %11.0f", P, T / P);
    os << line;
    for (const dist::Link& l : links) {
      char cell[64];
      std::snprintf(
          cell, sizeof cell, "  %10s / %8s",
          f("%.3f", dist::ring_efficiency(ring_shape(*ref, r.causal, false), P, T / P, Ff, l)).c_str(),
          f("%.3f",
            std::isnan(Fb) ? NAN : dist::ring_efficiency(ring_shape(*ref, r.causal, true), P, T / P, Fb, l))
              .c_str());
      os << cell;
    }
    os << "\n";
  }
}

void write_csv(const std::string& path, const DistBenchReport& r) {
  std::ofstream out(path);
  if (!out) throw Error(ErrorCode::io_error, "--csv: cannot write '" + path + "'");
  out << "op,layout,B,Hq,Hkv,T,D,ranks,threads,dist_fwd_ms,base_fwd_ms,dist_fwd_bwd_ms,base_fwd_bwd_ms,"
         "dist_fwd_cpu_ms,base_fwd_cpu_ms,dist_fwd_bwd_cpu_ms,base_fwd_bwd_cpu_ms,busy_fwd_max_ms,busy_fwd_"
         "mean_ms,"
         "busy_bwd_max_ms,busy_bwd_mean_ms,work_max,work_mean,wait_fwd_ms,wait_bwd_ms,sent_bytes_per_rank,"
         "step_ms,"
         "step_compute_ms,latency_us,GBps\n";
  for (const DistRow& x : r.rows) {
    const double v[] = {x.dist.fwd_ms,
                        x.base.fwd_ms,
                        x.dist.fwd_bwd_ms,
                        x.base.fwd_bwd_ms,
                        x.dist.fwd_cpu_ms,
                        x.base.fwd_cpu_ms,
                        x.dist.fwd_bwd_cpu_ms,
                        x.base.fwd_bwd_cpu_ms,
                        x.busy_fwd_max,
                        x.busy_fwd_mean,
                        x.busy_bwd_max,
                        x.busy_bwd_mean,
                        x.work_max,
                        x.work_mean,
                        x.wait_fwd_max,
                        x.wait_bwd_max,
                        x.sent_mean,
                        x.step_ms,
                        x.step_compute_ms,
                        r.latency_us,
                        r.GBps};
    out << x.op << ',' << x.layout << ',' << x.shape.B << ',' << x.shape.Hq << ',' << x.shape.Hkv << ','
        << x.T << ',' << x.shape.D << ',' << r.ranks << ',' << r.threads;
    for (double d : v) out << ',' << d;
    out << '\n';
  }
  if (!out) throw Error(ErrorCode::io_error, "--csv: writing '" + path + "' failed");
}

}  // namespace attnops::cli
