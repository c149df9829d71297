// ragged_paged on the cpu, each against a yardstick measured in the same run:
//
//   bench_paged --benchmark_filter=Bandwidth   read bandwidth (sum of a 1 GiB f32 array, all threads)
//   bench_paged --benchmark_filter=DecodeBatch 64 sequences, kv_len in [128, 8192], Hq 32 Hkv 8 D 128,
//                                              q_len 1; bf16 and f32, pages of 16 and 128 tokens:
//                                              kv_GBps (K/V bytes read / s) and pct_of_bw
//   bench_paged --benchmark_filter=MixBatch    the same with 1/8 of the sequences in chunked prefill (256)
//   bench_paged --benchmark_filter=LongDecode  one sequence, Tk 32768, H 16, D 128: paged vs dense (the
//                                              dense decode of the same data, flash_attn2 -> vanilla)
//   bench_paged --benchmark_filter=Prefill     one sequence of 2048 tokens, H 16, D 128, causal: paged vs
//                                              dense flash_attn2
//   bench_paged --benchmark_filter=Plan        plan_paged for 256 decode sequences (host cost per step),
//                                              shared-prefix detection off / on
//   bench_paged --benchmark_filter=SharedPrefix 64 decode sequences sharing a 4096-token prompt
//                                              (128..1024 own keys each), bf16, sharing off / on
//   the /bf16_int8 and /bf16_fp8_e4m3 rows: DecodeBatch, LongDecode, Prefill over 8-bit caches
//
// Every benchmark reports real time with the minimum and maximum over --benchmark_repetitions (the
// "_min" rows: times; the "_max" rows: rates, kv_GBps and GBps, which Google Benchmark aggregates
// with the same function): on a shared machine a descheduled OpenMP thread stalls a whole call,
// so the best repetition is the figure that measures the code, not the neighbours. Ratios:
// compare rows of one run, e.g.
//   bench_paged --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "bench/bench_main.h"
#include "benchkit/bench_serving.h"
#include "benchkit/read_bandwidth.h"

namespace {

using attnops::DType;
using i64 = std::int64_t;

double g_read_gbps = 0, g_read_gbps_cpu = 0;

// Process CPU time (every thread), seconds.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double min_of(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}
double max_of(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}

void BM_Bandwidth(benchmark::State& state) {
  attnops::benchkit::ReadBandwidth bw;
  for (auto _ : state) {
    bw = attnops::benchkit::measure_read_bandwidth(0, 3);
    state.SetIterationTime(bw.mib / 1024.0 / bw.gbps * 1.073741824);
  }
  g_read_gbps = std::max(g_read_gbps, bw.gbps);
  g_read_gbps_cpu = std::max(g_read_gbps_cpu, bw.gbps_per_cpu_second);
  state.counters["GBps"] = bw.gbps;
  state.counters["GB_per_cpu_s"] = bw.gbps_per_cpu_second;
}

// Batches are built once per shape (pools of gigabytes) and kept for the process. kv: the cache's
// dtype (8-bit caches: int8 / fp8_e4m3 under q of dtype dt).
const attnops::benchkit::ServingBatch& batch(const std::string& key,
                                             const attnops::benchkit::ServingRowSpec& row, i64 page, DType dt,
                                             std::optional<DType> kv = std::nullopt) {
  static std::map<std::string, std::unique_ptr<attnops::benchkit::ServingBatch>> cache;
  std::string name = key;  // piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "_" + string
  if (kv) {
    name += '_';
    name += attnops::dtype_name(*kv);
  }
  auto& slot = cache[name];
  if (!slot)
    slot = std::make_unique<attnops::benchkit::ServingBatch>(
        attnops::benchkit::make_serving_batch(row, page, dt, 7, kv));
  return *slot;
}

attnops::Attention op(const char* name) {
  attnops::OperationMetadata md = attnops::registry().entry(name).defaults;  // its fallbacks (decode)
  md.backends = {attnops::Backend::cpu};
  return attnops::registry().get(name, md);
}

// cpu: process CPU seconds the timed loop took (every thread): on a shared machine the threads
// run a fraction of the wall time, so bytes per CPU second (and the same rate of the read loop)
// measure the code where wall-clock rates measure the neighbours.
void report(benchmark::State& state, const attnops::benchkit::ServingBatch& b, double cpu,
            double keys_read = -1) {
  const double bytes = (keys_read >= 0 ? keys_read : static_cast<double>(b.kv_tokens)) * b.key_bytes;
  state.counters["kv_GBps"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (cpu > 0)
    state.counters["kv_GB_per_cpu_s"] = bytes * 1e-9 * static_cast<double>(state.iterations()) / cpu;
  if (g_read_gbps_cpu > 0) state.counters["read_GB_per_cpu_s"] = g_read_gbps_cpu;
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(b.N), benchmark::Counter::kIsIterationInvariantRate);
  if (g_read_gbps > 0) state.counters["read_GBps"] = g_read_gbps;
}

double run_paged(benchmark::State& state, const attnops::benchkit::ServingBatch& b, i64 Hq,
                 bool share = true) {
  const attnops::Attention attn = op("ragged_paged");
  attnops::PagedAttentionOptions opts;
  opts.share_prefixes = share;
  const attnops::PagedPlan plan = attnops::plan_paged(b.batch, b.cache.spec(), b.N, Hq, opts);
  std::string decision;
  const double c0 = cpu_seconds();
  for (auto _ : state) {
    attnops::AttentionOutput o = attn.paged(b.q, b.cache, plan, opts);
    if (decision.empty()) decision = o.decision.to_log_line();
    benchmark::DoNotOptimize(o.out.data());
  }
  const double cpu = cpu_seconds() - c0;
  state.SetLabel(decision);
  return cpu;
}

void BM_DecodeBatch(benchmark::State& state, DType dt, std::optional<DType> kv) {
  const i64 page = state.range(0);
  attnops::benchkit::ServingRowSpec row;  // the defaults: 64 sequences, [128, 8192], q_len 1, 32/8, D 128
  const auto& b =
      batch("decode" + std::to_string(page) + std::string(attnops::dtype_name(dt)), row, page, dt, kv);
  const double cpu = run_paged(state, b, row.Hq);
  report(state, b, cpu);
}

void BM_MixBatch(benchmark::State& state, DType dt) {
  attnops::benchkit::ServingRowSpec row;
  row.prefill_fraction = 0.125;
  row.prefill_q_len = 256;
  const auto& b = batch("mix" + std::string(attnops::dtype_name(dt)), row, 16, dt);
  const double cpu = run_paged(state, b, row.Hq);
  report(state, b, cpu);
}

// 64 decode sequences sharing a 4096-token prompt, each with 128..1024 own keys; sharing on
// (state.range(0) == 1) or off. kv_GBps counts the bytes read (a shared item's keys once).
void BM_SharedPrefix(benchmark::State& state, DType dt) {
  attnops::benchkit::ServingRowSpec row;
  row.shared_prefix = 4096, row.kv_min = 128, row.kv_max = 1024;
  const auto& b = batch("shared" + std::string(attnops::dtype_name(dt)), row, 16, dt);
  const bool share = state.range(0) == 1;
  const double cpu = run_paged(state, b, row.Hq, share);
  attnops::PagedAttentionOptions opts;
  opts.share_prefixes = share;
  double keys = static_cast<double>(b.kv_tokens);
  for (const attnops::PagedWorkItem& it :
       attnops::plan_paged(b.batch, b.cache.spec(), b.N, row.Hq, opts).work())
    if (it.kind == attnops::PagedWorkKind::shared)
      keys -= static_cast<double>((it.member_count - 1) * (it.kv_end - it.kv_begin));
  report(state, b, cpu, keys);
}

attnops::benchkit::ServingRowSpec one_sequence(i64 kv, i64 q) {
  attnops::benchkit::ServingRowSpec row;
  row.seqs = 1, row.kv_min = row.kv_max = kv, row.q_len = q, row.Hq = 16, row.Hkv = 16, row.D = 128;
  return row;
}

// Paged (state.range(0) == 0) or dense (1) over the same tokens: the dense call reads k, v gathered
// from the pages into [1, T, H, D].
void same_tokens(benchmark::State& state, const std::string& key, i64 kv, i64 q, DType dt,
                 std::optional<DType> kvt = std::nullopt) {
  const attnops::benchkit::ServingRowSpec row = one_sequence(kv, q);
  const auto& b = batch(key + std::string(attnops::dtype_name(dt)), row, 16, dt, kvt);
  double cpu = 0;
  if (state.range(0) == 0 || kvt) {  // an 8-bit cache has no dense form: paged only
    cpu = run_paged(state, b, row.Hq);
  } else {
    const attnops::TensorView page_row(b.table.data(), DType::i32, {b.table.dim(1)});
    const attnops::PagedKVCache::Dense d = b.cache.gather(page_row, kv);
    const attnops::TensorView qd(b.q.data(), dt, {1, q, row.Hq, row.D});
    const attnops::Attention attn = op("flash_attn2");
    std::string decision;
    const double c0 = cpu_seconds();
    for (auto _ : state) {
      attnops::AttentionOutput o = attn(qd, d.k, d.v);
      if (decision.empty()) decision = o.decision.to_log_line();
      benchmark::DoNotOptimize(o.out.data());
    }
    cpu = cpu_seconds() - c0;
    state.SetLabel(decision);
  }
  report(state, b, cpu);
  const double flops = b.pairs * static_cast<double>(row.Hq) * 4.0 * static_cast<double>(row.D);
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_LongDecode(benchmark::State& state, DType dt, std::optional<DType> kv) {
  same_tokens(state, "long", 32768, 1, dt, kv);
}
void BM_Prefill(benchmark::State& state, DType dt, std::optional<DType> kv) {
  same_tokens(state, "prefill", 2048, 2048, dt, kv);
}

// plan_paged for 256 decode sequences, shared-prefix detection off (range(1) == 0) or on.
void BM_Plan(benchmark::State& state) {
  attnops::benchkit::ServingRowSpec row;
  row.seqs = state.range(0);
  // Only the index arrays matter here: a tiny head shape keeps the pools small.
  row.D = 1;
  const auto& b = batch("plan" + std::to_string(row.seqs), row, 16, DType::f32);
  attnops::PagedAttentionOptions opts;
  opts.share_prefixes = state.range(1) == 1;
  for (auto _ : state)
    benchmark::DoNotOptimize(attnops::plan_paged(b.batch, b.cache.spec(), b.N, row.Hq, opts));
}

template <class B>
B* common(B* b) {
  return b->UseRealTime()->ComputeStatistics("min", min_of)->ComputeStatistics("max", max_of);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("BM_Bandwidth", BM_Bandwidth)
      ->ComputeStatistics("min", min_of)
      ->ComputeStatistics("max", max_of)
      ->UseManualTime()
      ->Iterations(3)
      ->Unit(benchmark::kMillisecond);
  // 8-bit caches under bf16 queries: the decode batch, the long decode and the prefill.
  for (DType kv : {DType::i8, DType::fp8_e4m3}) {
    const std::string n = "bf16_" + std::string(attnops::dtype_name(kv));
    common(benchmark::RegisterBenchmark(("BM_DecodeBatch/" + n).c_str(), BM_DecodeBatch, DType::bf16,
                                        std::optional<DType>(kv)))
        ->ArgName("page")
        ->Arg(16)
        ->Unit(benchmark::kMillisecond);
    common(benchmark::RegisterBenchmark(("BM_LongDecode/" + n).c_str(), BM_LongDecode, DType::bf16,
                                        std::optional<DType>(kv)))
        ->ArgName("dense")
        ->Arg(0)
        ->Unit(benchmark::kMicrosecond);
    common(benchmark::RegisterBenchmark(("BM_Prefill/" + n).c_str(), BM_Prefill, DType::bf16,
                                        std::optional<DType>(kv)))
        ->ArgName("dense")
        ->Arg(0)
        ->Unit(benchmark::kMillisecond);
  }
  common(benchmark::RegisterBenchmark("BM_SharedPrefix/bf16", BM_SharedPrefix, DType::bf16))
      ->ArgName("share")
      ->Arg(0)
      ->Arg(1)
      ->Unit(benchmark::kMillisecond);
  for (DType dt : {DType::bf16, DType::f32}) {
    const std::string n(attnops::dtype_name(dt));
    common(benchmark::RegisterBenchmark(("BM_DecodeBatch/" + n).c_str(), BM_DecodeBatch, dt, std::nullopt))
        ->ArgName("page")
        ->Arg(16)
        ->Arg(128)
        ->Unit(benchmark::kMillisecond);
    common(benchmark::RegisterBenchmark(("BM_MixBatch/" + n).c_str(), BM_MixBatch, dt))
        ->Unit(benchmark::kMillisecond);
    common(benchmark::RegisterBenchmark(("BM_LongDecode/" + n).c_str(), BM_LongDecode, dt, std::nullopt))
        ->ArgName("dense")
        ->Arg(0)
        ->Arg(1)
        ->Unit(benchmark::kMicrosecond);
    common(benchmark::RegisterBenchmark(("BM_Prefill/" + n).c_str(), BM_Prefill, dt, std::nullopt))
        ->ArgName("dense")
        ->Arg(0)
        ->Arg(1)
        ->Unit(benchmark::kMillisecond);
  }
  common(benchmark::RegisterBenchmark("BM_Plan", BM_Plan))
      ->ArgNames({"seqs", "share"})
      ->Args({256, 0})
      ->Args({256, 1})
      ->Unit(benchmark::kMicrosecond);
  return attnops::bench::benchmark_main(argc, argv);
}
