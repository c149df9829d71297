// `attnops bench`: a sweep of operators x backends x shapes x dtypes x causal, timed on this
// machine, with the GEMM ceilings measured in the same run (same threads): Eigen's SGEMM (its best
// ISA copy for this CPU: benchkit/sgemm.h) and, where libdnnl is installed, oneDNN's f32 and bf16
// matmuls with the implementation oneDNN chose (benchkit/onednn_gemm.h). Each row's vs_gemm is its
// GFLOP/s over the best GEMM of the machine for its dtype (ceiling_for): f32 and f16 rows (the
// FMA units) against the better f32 GEMM, bf16 rows against the best of all (on an AMX Xeon
// oneDNN's bf16 matmul on the tiles; elsewhere oneDNN's bf16 can be slower than its f32).
//
// Each row: the operator asked for and the one that ran, the backend actually used and the
// kernel variant inside it (from the decision: the cpu ISA tier, e.g. avx512bf16), the median
// time over --repeats samples (each the mean of enough calls to last >= 20 ms), GFLOP/s and the
// max error against the fp64 oracle on a small verification run of the same configuration (same
// operator, backend, dtype, mask, heads and head_dim; sequence lengths cut to <= 256, keeping
// Tq == 1 and Tq % 128 != 0 as they were so that the same fallbacks apply).
//
// GFLOP/s = 2 * (D + Dv) * B * Hq * (visible (q, k) pairs) / time: 4*B*Hq*Tq*Tk*D for a dense
// mask, only the visible pairs for causal (about half), as the benchmarks of flash attention do.
//
// Backward rows (passes: backward) run the forward once (with lse) outside the timing and time
// attn.backward(q, k, v, forward, dout); their GFLOP/s count 2.5 times the forward's FLOPs (the
// usual convention), their max_err is the largest gradient error against the fp64 backward
// oracle, and their decision (ran, backend, reasons) is the backward's.
// GPU rows, forward and backward, also report the kernels alone (kernel_ms, kernel GFLOP/s: the
// median of the GPU timestamps of profiled calls), next to the end-to-end time that includes
// uploads, read-backs and the fixed cost of a call. The backend `gpu_resident` is the gpu with q, k, v
// uploaded once as device tensors before timing (the output stays on the device), as a model keeping its
// activations and KV cache on the GPU would call it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map.h"
#include "backends/common/block_map_impl.h"
#include "benchkit/background_load.h"
#include "benchkit/bench_serving.h"
#include "benchkit/bench_spec.h"
#include "benchkit/median_timer.h"
#include "benchkit/onednn_gemm.h"
#include "benchkit/plot.h"
#include "benchkit/progress.h"
#include "benchkit/sgemm.h"
#include "cli/commands.h"
#include "cli/decision_text.h"
#include "cli/inputs.h"
#include "cli/output_set.h"
#include "cli/settings.h"
#include "cli/verify.h"

namespace attnops::cli {

using namespace benchkit;  // the benchmark harness's specs, timers and yardsticks
namespace {

constexpr const char* kFlopsNote =
    "GFLOP/s = 4*B*Hq*D*(visible q,k pairs)/time: dense rows count Tq*Tk pairs, causal rows only the visible "
    "ones (about half); backward rows count 2.5 times that";

struct BenchArgs {
  std::string file, ops, backends, shapes, dtypes, passes, config, csv, json, plot, serving_json;
  bool causal = false, no_causal = false, both = false, progress = false, no_progress = false;
  int repeats = 0, threads = 0, sgemm = -1, background_load = 0;
};

// The run's GEMM ceilings: Eigen's SGEMM and oneDNN's matmuls (an error text where missing).
struct Ceilings {
  SgemmResult sgemm;
  std::vector<GemmCeiling> onednn;
};

// The best GEMM rate for rows of `dtype`: f32 GEMMs for f32 and f16 rows (their kernels run on the
// FMA units), every GEMM for bf16 rows. NAN when none was measured.
double ceiling_for(const Ceilings& c, DType dtype, std::string* name) {
  double best = NAN;
  auto consider = [&](double gflops, const std::string& what) {
    if (std::isfinite(gflops) && gflops > 0 && !(gflops <= best)) {
      best = gflops;
      *name = what;
    }
  };
  if (c.sgemm.n > 0) consider(c.sgemm.gflops, "eigen_sgemm");
  for (const GemmCeiling& g : c.onednn)
    if (g.ok() && (g.dtype == DType::f32 || dtype == DType::bf16)) consider(g.gflops, g.name);
  return best;
}

struct Row {
  std::string op, backend_requested;  // what was asked for
  std::string ran, backend;           // what the decision says ran
  std::string kernel;                 // the backend's kernel variant (decision.run.kernel)
  std::string reasons;                // reason codes, comma separated
  BenchShape shape;
  DType dtype = DType::f32;
  bool causal = true;
  Pass pass = Pass::forward;
  double median_ms = NAN, gflops = NAN, vs_sgemm = NAN, max_err = NAN;
  double vs_gemm = NAN;                         // over the best GEMM for the row's dtype (ceiling_for)
  std::string gemm;                             // which one
  double kernel_ms = NAN, kernel_gflops = NAN;  // gpu rows: the kernels alone (timestamps)
  double loaded_ms = NAN;                       // --background-load: the median with the busy processes
  std::string error;                            // when the row could not run
};

// Visible (q, k) pairs of one head, as the kernels' block map counts them.
double visible_pairs(const AttentionProblem& p) {
  return get_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k)->visible_pairs_per_head();
}

// The verification shape: the same routing (Tq == 1, Tq % 128) at a size the oracle checks fast.
BenchShape verification_shape(const BenchShape& s) {
  BenchShape v = s;
  auto cut = [](std::int64_t t) { return t <= 256 ? t : (t % 128 == 0 ? 256 : 200); };
  v.Tq = cut(s.Tq);
  v.Tk = s.Tk == s.Tq ? v.Tq : std::max(v.Tq, std::min<std::int64_t>(s.Tk, 512));
  v.B = 1;
  return v;
}

Qkv make_inputs(const BenchShape& s, DType dtype, std::uint64_t seed) {
  return random_qkv(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, dtype, seed);
}

void run_row(Row& row, const Config& config, const CallSettings& threads, int repeats, int background_load) {
  CallSettings settings = threads;
  const bool resident = row.backend_requested == "gpu_resident";
  settings.backends = parse_backend_list(resident ? "gpu" : row.backend_requested);
  const Attention attn = registry().get(row.op, config);
  AttentionOptions opts;
  opts.causal = row.causal;
  set_call_settings(opts, settings);

  const Qkv in = make_inputs(row.shape, row.dtype, 7);
  const bool backward = row.pass == Pass::backward;
  if (backward) opts.return_lse = true;
  if (backward && resident)
    throw Error(ErrorCode::invalid_argument,
                "bench: backward rows read host tensors (the backward has no device-resident path yet): "
                "use the gpu backend, not gpu_resident");
  DeviceTensor dq, dk, dv;  // gpu_resident: the inputs live on the device during the timing
  if (resident) {
    const GpuSettings& gpu = attn.metadata().gpu;
    dq = to_device(in.q, gpu), dk = to_device(in.k, gpu), dv = to_device(in.v, gpu);
  }
  const auto forward = [&](const AttentionOptions& op) {
    return resident ? attn(dq, dk, dv, op) : attn(in.q, in.k, in.v, op);
  };
  // Warm-up (allocations, pipelines, block maps); for a backward row, its forward's residuals.
  AttentionOutput r = forward(opts);
  const Tensor dout = backward ? random_tensor(row.dtype, r.out.shape(), 8) : Tensor();
  DispatchDecision decision = r.decision;
  const auto call = [&] {
    if (!backward) {
      r = forward(opts);
      decision = r.decision;
    } else {
      decision = attn.backward(in.q, in.k, in.v, r, dout, opts).decision;
    }
  };
  if (backward) call();
  // Each sample is the mean of enough calls to last >= 20 ms (benchkit/median_timer.h).
  constexpr int kSettleMs = 20;  // after the busy processes resume, before a loaded sample
  std::vector<double> quiet, loaded;
  if (background_load <= 0) {
    for (int i = 0; i < repeats; ++i) quiet.push_back(mean_call_ms(call));
  } else {
    // Quiet and loaded samples alternate (the busy processes stopped for the quiet ones), so both
    // medians see the same machine within a sample's time of each other.
    BackgroundLoad load(background_load);
    for (int i = 0; i < repeats; ++i) {
      load.pause();
      quiet.push_back(mean_call_ms(call));
      load.resume(kSettleMs);
      loaded.push_back(mean_call_ms(call));
    }
    row.loaded_ms = median_of(loaded);
  }
  row.median_ms = median_of(quiet);
  row.ran = decision.op;
  row.backend = std::string(backend_name(decision.backend));
  row.kernel = decision.run.kernel;
  row.reasons = reason_codes(decision);
  const OperationMetadata& md = metadata_that_ran(attn, decision);
  const AttentionProblem p = make_problem(in.q, in.k, in.v, opts, md);
  const double flops = backward ? backward_flops(p, visible_pairs(p)) : attention_flops(p, visible_pairs(p));
  row.gflops = flops / (row.median_ms * 1e6);
  if (decision.backend == Backend::gpu) {
    AttentionOptions prof = opts;
    prof.profile = true;
    std::vector<double> kms;
    for (int i = 0; i < std::max(repeats, 3); ++i) {
      const RunInfo run =
          backward ? attn.backward(in.q, in.k, in.v, r, dout, prof).decision.run : forward(prof).decision.run;
      if (run.timings && run.timings->device_timestamps) kms.push_back(run.timings->kernel_ms);
    }
    if (!kms.empty()) {
      std::sort(kms.begin(), kms.end());
      row.kernel_ms = kms[kms.size() / 2];
      row.kernel_gflops = flops / (row.kernel_ms * 1e6);
    }
  }

  const Qkv small = make_inputs(verification_shape(row.shape), row.dtype, 11);
  const AttentionOutput sr = attn(small.q, small.k, small.v, opts);  // host inputs: the same kernels
  if (!backward) {
    const OperationMetadata& smd = metadata_that_ran(attn, sr.decision);
    row.max_err = max_error_vs_oracle(small.q, small.k, small.v, opts, smd, sr.out);
  } else {
    const Tensor sdout = random_tensor(row.dtype, sr.out.shape(), 12);
    const AttentionGradients sg = attn.backward(small.q, small.k, small.v, sr, sdout, opts);
    row.max_err = max_gradient_error_vs_oracle(small.q, small.k, small.v, sr.out, *sr.lse, sdout, opts,
                                               metadata_that_ran(attn, sg.decision), sg);
  }
}

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

void print_table(std::ostream& out, const std::vector<Row>& rows, const Ceilings& ceilings,
                 int background_load) {
  const SgemmResult& sgemm = ceilings.sgemm;
  out << "# " << kFlopsNote << "\n";
  if (sgemm.n > 0)
    out << "# vs_gemm: GFLOP/s over the best GEMM of this run for the row's dtype (f32/f16 rows: the better "
           "f32 "
           "GEMM; bf16 rows: the best of all)\n";
  if (background_load > 0)
    out << "# loaded_ms: the median with " << background_load
        << " busy background process(es), its samples alternating with the quiet "
           "ones (the processes stopped between); x_quiet = loaded_ms / median_ms\n";
  char line[512];
  std::snprintf(line, sizeof line,
                "%-12s %-12s %-12s %-7s %-23s %-22s %-5s %-6s %-4s %10s %9s %10s %9s %8s %9s  %s\n",
                "operator", "asked", "ran", "backend", "kernel", "shape", "dtype", "causal", "pass",
                "median_ms", "GFLOP/s", "kernel_ms", "kern_GF/s", "vs_gemm", "max_err", "reasons");
  out << line;
  if (sgemm.n > 0) {
    const std::string shape = std::to_string(sgemm.n) + "^3";
    std::snprintf(line, sizeof line,
                  "%-12s %-12s %-12s %-7s %-23s %-22s %-5s %-6s %-4s %10.3f %9.1f %10s %9s %8.2f %9s  %s\n",
                  "eigen_sgemm", "-", "sgemm", "cpu", sgemm.isa.c_str(), shape.c_str(), "f32", "-", "-",
                  sgemm.median_ms, sgemm.gflops, "-", "-", 1.0, "-", "");
    out << line;
  }
  for (const GemmCeiling& g : ceilings.onednn) {
    const std::string shape = std::to_string(g.n) + "^3";
    std::snprintf(line, sizeof line,
                  "%-12s %-12s %-12s %-7s %-23s %-22s %-5s %-6s %-4s %10s %9s %10s %9s %8s %9s  %s\n",
                  g.name.c_str(), "-", "matmul", "cpu", g.impl.empty() ? "-" : g.impl.c_str(), shape.c_str(),
                  std::string(dtype_name(g.dtype)).c_str(), "-", "-", fmt("%.3f", g.median_ms).c_str(),
                  fmt("%.1f", g.gflops).c_str(), "-", "-", "-", "-",
                  g.error.empty() ? "" : ("error: " + g.error).c_str());
    out << line;
  }
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line,
                  "%-12s %-12s %-12s %-7s %-23s %-22s %-5s %-6s %-4s %10s %9s %10s %9s %8s %9s  %s\n",
                  r.op.c_str(), r.backend_requested.c_str(), r.ran.empty() ? "-" : r.ran.c_str(),
                  r.backend.empty() ? "-" : r.backend.c_str(), r.kernel.empty() ? "-" : r.kernel.c_str(),
                  r.shape.label().c_str(), std::string(dtype_name(r.dtype)).c_str(), r.causal ? "yes" : "no",
                  r.pass == Pass::backward ? "bwd" : "fwd", fmt("%.3f", r.median_ms).c_str(),
                  fmt("%.1f", r.gflops).c_str(), fmt("%.3f", r.kernel_ms).c_str(),
                  fmt("%.1f", r.kernel_gflops).c_str(), fmt("%.3f", r.vs_gemm).c_str(),
                  fmt("%.2e", r.max_err).c_str(),
                  r.error.empty() ? r.reasons.c_str() : ("error: " + r.error).c_str());
    out << line;
    if (background_load > 0)
      out << "    loaded_ms " << fmt("%.3f", r.loaded_ms) << "  x_quiet "
          << fmt("%.2f", r.loaded_ms / r.median_ms) << "\n";
  }
}

// A CSV field in double quotes, with inner quotes doubled (RFC 4180).
std::string csv_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string csv_text(const std::vector<Row>& rows, const Ceilings& ceilings, bool loaded) {
  const SgemmResult& sgemm = ceilings.sgemm;
  std::ostringstream f;
  f << "operator,backend_requested,ran,backend,kernel,B,Hq,Hkv,Tq,Tk,D,dtype,causal,pass,"
       "median_ms,gflops,kernel_ms,kernel_gflops,vs_sgemm,max_err,reasons,error,vs_gemm,gemm"
    << (loaded ? ",loaded_median_ms\n" : "\n");
  auto num = [](double v) { return std::isfinite(v) ? fmt("%.6g", v) : std::string(); };
  if (sgemm.n > 0)
    f << "eigen_sgemm,,sgemm,cpu," << sgemm.isa << ",,,,,," << sgemm.n << ",f32,,," << num(sgemm.median_ms)
      << "," << num(sgemm.gflops) << ",,,1,,,,," << (loaded ? ",\n" : "\n");
  for (const GemmCeiling& g : ceilings.onednn)
    f << g.name << ",,matmul,cpu," << csv_quote(g.impl) << ",,,,,," << g.n << "," << dtype_name(g.dtype)
      << ",,," << num(g.median_ms) << "," << num(g.gflops) << ",,,,,," << csv_quote(g.error) << ",,"
      << (loaded ? ",\n" : "\n");
  for (const Row& r : rows)
    f << r.op << "," << r.backend_requested << "," << r.ran << "," << r.backend << "," << r.kernel << ","
      << r.shape.B << "," << r.shape.Hq << "," << r.shape.Hkv << "," << r.shape.Tq << "," << r.shape.Tk << ","
      << r.shape.D << "," << dtype_name(r.dtype) << "," << (r.causal ? "true" : "false") << ","
      << pass_name(r.pass) << "," << num(r.median_ms) << "," << num(r.gflops) << "," << num(r.kernel_ms)
      << "," << num(r.kernel_gflops) << "," << num(r.vs_sgemm) << "," << num(r.max_err) << ","
      << csv_quote(r.reasons) << "," << csv_quote(r.error) << "," << num(r.vs_gemm) << "," << r.gemm
      << (loaded ? "," + num(r.loaded_ms) : "") << "\n";
  return f.str();
}

std::string json_text(const std::vector<Row>& rows, const Ceilings& ceilings, int background_load) {
  const SgemmResult& sgemm = ceilings.sgemm;
  nlohmann::json j;
  j["flops_convention"] = kFlopsNote;
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  if (sgemm.n > 0)
    j["sgemm"] = {
        {"n", sgemm.n}, {"median_ms", sgemm.median_ms}, {"gflops", sgemm.gflops}, {"isa", sgemm.isa}};
  j["gemms"] = nlohmann::json::array();
  for (const GemmCeiling& g : ceilings.onednn)
    j["gemms"].push_back({{"name", g.name},
                          {"dtype", std::string(dtype_name(g.dtype))},
                          {"n", g.n},
                          {"median_ms", num(g.median_ms)},
                          {"gflops", num(g.gflops)},
                          {"impl", g.impl},
                          {"error", g.error}});
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows)
    j["rows"].push_back({{"operator", r.op},
                         {"backend_requested", r.backend_requested},
                         {"ran", r.ran},
                         {"backend", r.backend},
                         {"kernel", r.kernel},
                         {"B", r.shape.B},
                         {"Hq", r.shape.Hq},
                         {"Hkv", r.shape.Hkv},
                         {"Tq", r.shape.Tq},
                         {"Tk", r.shape.Tk},
                         {"D", r.shape.D},
                         {"dtype", std::string(dtype_name(r.dtype))},
                         {"causal", r.causal},
                         {"pass", std::string(pass_name(r.pass))},
                         {"median_ms", num(r.median_ms)},
                         {"gflops", num(r.gflops)},
                         {"kernel_ms", num(r.kernel_ms)},
                         {"kernel_gflops", num(r.kernel_gflops)},
                         {"vs_sgemm", num(r.vs_sgemm)},
                         {"vs_gemm", num(r.vs_gemm)},
                         {"gemm", r.gemm},
                         {"max_err", num(r.max_err)},
                         {"reasons", r.reasons},
                         {"error", r.error}});
  if (background_load > 0) {
    j["background_load"] = background_load;
    for (std::size_t i = 0; i < rows.size(); ++i) j["rows"][i]["loaded_median_ms"] = num(rows[i].loaded_ms);
  }
  return j.dump(2) + "\n";
}

void plot_rows(const std::string& path, int fd, const std::vector<Row>& rows, const Ceilings& ceilings,
               bool both_causal, bool several_dtypes, bool both_passes) {
  const SgemmResult& sgemm = ceilings.sgemm;
  PlotSpec spec;
  spec.title = "attnops bench: GFLOP/s per shape (causal rows count visible pairs only)";
  spec.ylabel = "GFLOP/s";
  std::map<std::string, std::size_t> category_index;
  std::map<std::string, std::size_t> series_index;
  std::map<std::string, std::set<std::string>> ran_on;
  // x: one category per shape (and dtype when several); one series per operator/backend asked
  // for (and causal mode when both are swept).
  const auto category_of = [&](const Row& r) {
    return several_dtypes ? r.shape.label() + " " + std::string(dtype_name(r.dtype)) : r.shape.label();
  };
  const auto series_of = [&](const Row& r) {
    std::string key = r.op + "/" + r.backend_requested;
    if (both_causal) key += r.causal ? " causal" : " non-causal";
    if (both_passes) key += r.pass == Pass::backward ? " backward" : " forward";
    return key;
  };
  for (const Row& r : rows) {
    const std::string cat = category_of(r);
    if (!category_index.count(cat)) {
      category_index[cat] = spec.categories.size();
      spec.categories.push_back(cat);
    }
    const std::string key = series_of(r);
    if (!series_index.count(key)) {
      series_index[key] = spec.series.size();
      spec.series.push_back({key, {}});
    }
    if (!r.backend.empty())
      ran_on[key].insert(r.ran + "@" + r.backend + (r.kernel.empty() ? "" : "/" + r.kernel));
  }
  for (auto& s : spec.series) {
    s.values.assign(spec.categories.size(), NAN);
    std::string ran;
    for (const auto& x : ran_on[s.name]) {
      if (!ran.empty()) ran += ", ";
      ran += x;
    }
    if (!ran.empty()) s.name += " (ran " + ran + ")";
  }
  for (const Row& r : rows)
    spec.series[series_index[series_of(r)]].values[category_index[category_of(r)]] = r.gflops;
  if (sgemm.n > 0)
    spec.hlines.emplace_back("Eigen SGEMM " + std::to_string(sgemm.n) + "^3 (" + sgemm.isa + ")",
                             sgemm.gflops);
  for (const GemmCeiling& g : ceilings.onednn)
    if (g.ok())
      spec.hlines.emplace_back("oneDNN " + std::string(dtype_name(g.dtype)) + " matmul " +
                                   std::to_string(g.n) + "^3 (" + g.impl + ")",
                               g.gflops);
  write_plot(spec, path, fd);
}

int bench(const BenchArgs& a) {
  BenchSpec spec = a.file.empty() ? BenchSpec{} : load_bench_file(a.file);
  if (!a.ops.empty()) spec.ops = split(a.ops, ',');
  if (!a.backends.empty()) spec.backends = split(a.backends, ',');
  for (const auto& b : spec.backends)  // reject typos before any timing
    if (b != "gpu_resident") parse_backend_list(b);
  if (!a.shapes.empty()) spec.shapes = parse_bench_shapes(a.shapes);
  // A file of serving rows only (no dense shapes) runs just those (benchkit/bench_serving.h).
  const bool serving_only = !spec.serving.empty() && spec.shapes.empty();
  if (spec.shapes.empty()) spec.shapes = {parse_bench_shape("1,8,512,64")};
  if (!a.dtypes.empty()) {
    spec.dtypes.clear();
    for (const auto& s : split(a.dtypes, ',')) {
      const auto d = parse_dtype(s);
      if (!d || !is_float(*d))
        throw Error(ErrorCode::invalid_argument, "--dtypes: unknown float dtype '" + s + "'");
      spec.dtypes.push_back(*d);
    }
  }
  if (!a.passes.empty()) spec.passes = parse_passes(a.passes);
  if (a.causal) spec.causal = {true};
  if (a.no_causal) spec.causal = {false};
  if (a.both) spec.causal = {true, false};
  if (a.repeats > 0) spec.repeats = a.repeats;
  if (a.sgemm >= 0) spec.sgemm = a.sgemm;
  if (spec.ops.empty()) spec.ops = registry().list();
  for (const auto& op : spec.ops) registry().canonical(op);  // unknown names fail before any timing
  if (!a.plot.empty()) plot_terminal(a.plot);                // so does a plot file gnuplot cannot write
  check_bench_size(spec, spec.ops.size(), physical_memory_bytes());  // and a sweep larger than the machine
  // The output files are reserved now (a bad path, or one file for two outputs, fails before
  // any timing) and appear only once all were written (output_set.h); gnuplot writes to the
  // plot's descriptor, never a path.
  if (serving_only && (!a.csv.empty() || !a.json.empty() || !a.plot.empty()))
    throw Error(ErrorCode::invalid_argument,
                std::string(!a.csv.empty()    ? "--csv"
                            : !a.json.empty() ? "--json"
                                              : "--plot") +
                    ": the bench has serving rows only (no dense rows to write); use --serving-json");
  OutputSet outs;
  const int csv_file = a.csv.empty() ? -1 : outs.add(a.csv, "--csv");
  const int json_file = a.json.empty() ? -1 : outs.add(a.json, "--json");
  const int plot_file = a.plot.empty() ? -1 : outs.add(a.plot, "--plot");
  const int serving_json_file = a.serving_json.empty() ? -1 : outs.add(a.serving_json, "--serving-json");

  const Config config = load_optional_config(a.config);
  CallSettings threads;
  if (a.threads > 0) threads.num_threads = a.threads;
  const bool show = a.no_progress ? false : (a.progress || ProgressBar::stderr_is_tty());
  if (serving_only) {
    const std::string json =
        run_serving_bench(spec, config, a.threads, std::cout, serving_json_file >= 0, show);
    if (serving_json_file >= 0) outs.write(serving_json_file, json);
    outs.commit();
    return std::cout ? 0 : 2;
  }

  std::vector<Row> rows;
  for (const auto& op : spec.ops)
    for (const auto& backend : spec.backends)
      for (const auto& shape : spec.shapes)
        for (DType dtype : spec.dtypes)
          for (bool causal : spec.causal)
            for (Pass pass : spec.passes) {
              Row r;
              r.op = op;
              r.backend_requested = backend;
              r.shape = shape;
              r.dtype = dtype;
              r.causal = causal;
              r.pass = pass;
              rows.push_back(std::move(r));
            }

  ProgressBar bar(rows.size() + (spec.sgemm > 0 ? 3 : 0), show);
  std::size_t done = 0;
  Ceilings ceilings;
  if (spec.sgemm > 0) {
    bar.update(done, "eigen sgemm " + std::to_string(spec.sgemm));
    ceilings.sgemm = measure_sgemm(spec.sgemm, spec.repeats, a.threads);
    ++done;
    for (DType dt : {DType::f32, DType::bf16}) {
      bar.update(done, "onednn matmul " + std::string(dtype_name(dt)) + " " + std::to_string(spec.sgemm));
      ceilings.onednn.push_back(measure_onednn_matmul(spec.sgemm, dt, spec.repeats, a.threads));
      ++done;
    }
  }
  for (Row& r : rows) {
    bar.update(done, r.op + "/" + r.backend_requested + " " + r.shape.label() + " " +
                         std::string(dtype_name(r.dtype)) + (r.causal ? " causal" : " non-causal") +
                         (r.pass == Pass::backward ? " backward" : ""));
    try {
      run_row(r, config, threads, spec.repeats, a.background_load);
      if (ceilings.sgemm.gflops > 0) r.vs_sgemm = r.gflops / ceilings.sgemm.gflops;
      const double best = ceiling_for(ceilings, r.dtype, &r.gemm);
      if (best > 0) r.vs_gemm = r.gflops / best;
    } catch (const Error& e) {  // one failing configuration must not lose the rest of the sweep
      r.error = std::string(error_code_name(e.code())) + ": " + e.what();
    } catch (const std::bad_alloc&) {  // a std::vector of the row's size past what the process may have
      r.error = "out_of_memory: the row's host allocations failed";
    }
    ++done;
  }
  bar.finish();

  print_table(std::cout, rows, ceilings, a.background_load);
  if (csv_file >= 0) outs.write(csv_file, csv_text(rows, ceilings, a.background_load > 0));
  if (json_file >= 0) outs.write(json_file, json_text(rows, ceilings, a.background_load));
  if (plot_file >= 0)
    plot_rows(a.plot, outs.fd(plot_file), rows, ceilings, spec.causal.size() > 1, spec.dtypes.size() > 1,
              spec.passes.size() > 1);
  if (!spec.serving.empty()) {
    const std::string json =
        run_serving_bench(spec, config, a.threads, std::cout, serving_json_file >= 0, show);
    if (serving_json_file >= 0) outs.write(serving_json_file, json);
  }
  outs.commit();
  return std::cout ? 0 : 2;
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* app = root.add_subcommand("bench", "Time operators x backends x shapes; table, CSV, JSON, plot");
  app->add_option("--file", a->file, "YAML bench file (e.g. config/bench_default.yaml); flags override it");
  app->add_option("--ops", a->ops, "Operators, comma separated (default: all)");
  app->add_option(
      "--backends", a->backends,
      "Backends to ask for, comma separated: auto,native,cpu,gpu,tpu, or gpu_resident (gpu with q, k, v "
      "kept on the device)");
  app->add_option("--shapes", a->shapes, "Shapes 'B,H,T,D[,Hkv];...' with T = Tq or Tq:Tk");
  app->add_option("--dtypes", a->dtypes, "Dtypes, comma separated: f32,f16,bf16");
  auto* c = app->add_flag("--causal", a->causal, "Causal rows only (the default)");
  auto* nc = app->add_flag("--no-causal", a->no_causal, "Non-causal rows only");
  app->add_flag("--both", a->both, "Causal and non-causal rows")->excludes(c)->excludes(nc);
  app->add_option("--passes", a->passes, "forward, backward or both (default forward)");
  nc->excludes(c);
  app->add_option("--repeats", a->repeats, "Timed runs per row (median reported)")
      ->check(CLI::PositiveNumber);
  app->add_option("--threads", a->threads, "OpenMP threads (0 = default)")->check(CLI::NonNegativeNumber);
  app->add_option(
         "--sgemm", a->sgemm,
         "Size n of the GEMM ceiling rows: Eigen's SGEMM and, with libdnnl, oneDNN's f32 and bf16 matmuls "
         "(0 = none)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--background-load", a->background_load,
                  "Also time each row with N busy background processes (stopped for the quiet samples, which "
                  "alternate with the loaded ones; killed after the row) and report the loaded median beside "
                  "the quiet one")
      ->check(CLI::Range(0, 64));
  app->add_option("--config", a->config, "YAML library configuration");
  app->add_option("--csv", a->csv, "Also write the rows as CSV");
  app->add_option("--json", a->json, "Also write the rows as JSON");
  app->add_option("--plot", a->plot, "Also plot GFLOP/s per shape (FILE.png or FILE.svg, needs gnuplot)");
  app->add_option("--serving-json", a->serving_json,
                  "Also write the serving rows (bench file key serving) as JSON");
  auto* p =
      app->add_flag("--progress", a->progress, "Draw the progress bar even when stderr is not a terminal");
  app->add_flag("--no-progress", a->no_progress, "Never draw the progress bar")->excludes(p);
  return {app, [a] { return bench(*a); }};
}

}  // namespace attnops::cli
