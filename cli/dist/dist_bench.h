// The pieces of `attnops bench --distributed` (dist_bench.cpp) and its report
// (dist_bench_report.cpp): rows, the cost model's calibration and projection.
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "attnops/dtype.h"
#include "benchkit/bench_spec.h"

namespace attnops::cli {

struct DistBenchArgs {
  bool distributed = false, causal = false, no_causal = false, backward = true, weak = false, baseline = true,
       project = false;
  std::string shapes = "1,16,8192,128", ops = "ring", layouts, local_op = "flash_attn2", backend, config,
              dtype = "f32", csv;
  int repeats = 3, threads = 1, baseline_threads = 0;
  long long progress_rows = 1024;
  double project_tokens = 1048576, project_gflops = 0;
};

struct Timing {
  double fwd_ms = NAN, fwd_bwd_ms = NAN;
  // Process CPU time (every thread; for P ranks the sum over the ranks): what the work cost,
  // much less sensitive than wall time to other jobs on a shared machine.
  double fwd_cpu_ms = NAN, fwd_bwd_cpu_ms = NAN;
  std::string kernel;
};

inline constexpr int kMaxModelSteps = 64;

struct DistRow {
  std::string op, layout;
  benchkit::BenchShape shape;
  DType dtype = DType::f32;
  std::int64_t T = 0;
  Timing dist, base;  // P ranks; one process with P threads
  double busy_fwd_max = 0, busy_fwd_mean = 0, busy_bwd_max = 0, busy_bwd_mean = 0;
  double wait_fwd_max = 0, wait_bwd_max = 0, sent_mean = 0;
  double work_max = 0, work_mean = 0;  // visible (q, k) pairs per rank (forward): the layout's balance
  int steps = 0;
  double step_ms = NAN, step_compute_ms = NAN;  // forward ring step: slowest rank, mean over steps
  double bytes_fwd_step = 0;
};

struct DistBenchReport {
  int ranks = 1, threads = 1;
  bool oversubscribed = false, causal = true;
  std::string transport;
  double latency_us = NAN, GBps = NAN;  // ping-pong between ranks 0 and 1
  std::vector<DistRow> rows;
};

void print_row(std::ostream& os, const DistBenchReport& r, const DistRow& row, bool backward);
// The calibration, the model's step times against the measured ones, and (with --project)
// the projection to P = 8 .. 1024.
void print_model(std::ostream& os, const DistBenchReport& r, const DistBenchArgs& a);
void write_csv(const std::string& path, const DistBenchReport& r);

}  // namespace attnops::cli
