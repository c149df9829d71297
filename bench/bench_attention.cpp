// Prefill attention speed through the public API, against an SGEMM ceiling in the same binary.
//
//   bench_attention --benchmark_filter=Sgemm          Eigen SGEMM 2048^3 (the ceiling proxy; the
//                                                     best ISA copy, benchkit/sgemm.h)
//   bench_attention --benchmark_filter=Attention/     ops x backends x shapes (see below)
//   bench_attention --benchmark_filter=BlockSizes/    flash_attn2 cpu, T=2048 D=128, bq x bk grid
//
// Names: Attention/<op>/<backend>/<dtype>/<causal|full>/B1_H16_T<T>_D<D>. Every call goes
// through attnops::registry().get(op, metadata) with metadata.backends = {backend} and the
// operator's own fallbacks switched off, so the timed work is that operator's kernel on that
// backend, validation and output allocation included (what a user gets); the label says which
// operator, backend and kernel variant (the cpu ISA tier; ATTNOPS_CPU_ISA caps it) really ran.
//
// Counter GFLOPs_visible: 4 * B * Hq * D * visible_pairs / time (2 flops per multiply-add, two
// products q.k and p.v, D == Dv), where visible_pairs counts only the (i, j) pairs the mask lets
// through: T^2 for full, T(T+1)/2 for causal. Skipped work is not counted as done.
// Counter GFLOPs (Sgemm): 2 * N^3 / time. Both use real (wall) time, since the work runs on
// OpenMP threads; the CPU column is the whole process's CPU time (all threads), which on a busy
// shared machine is the steadier measure of work done (GFLOP / CPU second / cores).
//
// Shapes: B=1, H=16, T in {512, 1024, 2048, 4096}, D in {64, 128}, plus D in {72, 80, 96, 112} at
// T=2048; causal and full; f32 and bf16; blocksparse and flash_attn2 on cpu; vanilla cpu f32 up to
// T=2048 for reference; native (scalar, slow) only at B=1 H=4 T=256 D=64.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "bench/bench_inputs.h"
#include "bench/bench_main.h"
#include "bench/bench_sgemm.h"

namespace {

using attnops::Backend;
using attnops::DType;
using attnops::Tensor;

using attnops::bench::filled;

struct Shape {
  std::int64_t B, H, T, D;
};

// One attention benchmark: inputs built once, then op(q, k, v) per iteration.
void run_attention(benchmark::State& state, const std::string& op, Backend backend, DType dt, bool causal,
                   Shape s, std::int64_t bq, std::int64_t bk) {
  const Tensor q = filled(dt, {s.B, s.T, s.H, s.D}, 1), k = filled(dt, {s.B, s.T, s.H, s.D}, 2),
               v = filled(dt, {s.B, s.T, s.H, s.D}, 3);
  attnops::OperationMetadata md = attnops::registry().entry(op).defaults;
  md.backends = {backend};
  md.fallbacks = attnops::FallbackPolicy{};  // time this operator's own kernel, never vanilla
  if (bq > 0) md.blocksize_q = bq;
  if (bk > 0) md.blocksize_k = bk;
  const attnops::Attention attn = attnops::registry().get(op, md);
  attnops::AttentionOptions o;
  o.causal = causal;
  std::string ran;
  for (auto _ : state) {
    attnops::AttentionOutput out = attn(q, k, v, o);
    benchmark::DoNotOptimize(out.out.data());
    if (ran.empty()) {  // operator/backend/kernel that ran, e.g. flash_attn2/cpu/avx512bf16
      ran = out.decision.op + "/" + std::string(attnops::backend_name(out.decision.backend));
      if (!out.decision.run.kernel.empty()) ran += "/" + out.decision.run.kernel;
    }
  }
  const double T = static_cast<double>(s.T);
  const double visible_pairs = causal ? T * (T + 1) / 2 : T * T;
  state.counters["GFLOPs_visible"] =
      benchmark::Counter(4.0 * static_cast<double>(s.B * s.H * s.D) * visible_pairs * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(ran);
}

std::string shape_name(Shape s) {
  std::string r = "B";  // appended piecewise: GCC 12 warns -Wrestrict on "B" + std::string (bug 105651)
  for (auto [tag, v] : {std::pair{"", s.B}, {"_H", s.H}, {"_T", s.T}, {"_D", s.D}})
    r.append(tag).append(std::to_string(v));
  return r;
}

void register_attention(const std::string& op, Backend backend, DType dt, bool causal, Shape s) {
  const std::string name = "Attention/" + op + "/" + std::string(attnops::backend_name(backend)) + "/" +
                           std::string(attnops::dtype_name(dt)) + "/" + (causal ? "causal" : "full") + "/" +
                           shape_name(s);
  benchmark::RegisterBenchmark(
      name.c_str(), [=](benchmark::State& st) { run_attention(st, op, backend, dt, causal, s, 0, 0); })
      ->Unit(benchmark::kMillisecond)
      ->MeasureProcessCPUTime()
      ->UseRealTime()
      ->MinTime(0.5);
}

void register_all() {
  attnops::bench::register_gemm_ceilings(2048);
  std::vector<Shape> shapes;
  for (std::int64_t T : {512, 1024, 2048, 4096})
    for (std::int64_t D : {64, 128}) shapes.push_back({1, 16, T, D});
  for (std::int64_t D : {72, 80, 96, 112}) shapes.push_back({1, 16, 2048, D});
  for (const char* op : {"flash_attn2", "blocksparse"})
    for (DType dt : {DType::f32, DType::bf16})
      for (bool causal : {false, true})
        for (const Shape& s : shapes) register_attention(op, Backend::cpu, dt, causal, s);
  for (bool causal : {false, true})
    for (const Shape& s : shapes)
      if (s.T <= 2048 && (s.D == 64 || s.D == 128))
        register_attention("vanilla", Backend::cpu, DType::f32, causal, s);
  for (const char* op : {"flash_attn2", "blocksparse"})
    for (bool causal : {false, true})
      register_attention(op, Backend::native, DType::f32, causal, {1, 4, 256, 64});

  // Block-size grid (how the operators' defaults were chosen).
  for (bool causal : {false, true})
    for (std::int64_t bq : {32, 64, 128, 256})
      for (std::int64_t bk : {32, 64, 128, 256, 512}) {
        const std::string name = "BlockSizes/flash_attn2/cpu/f32/" + std::string(causal ? "causal" : "full") +
                                 "/B1_H16_T2048_D128/bq" + std::to_string(bq) + "_bk" + std::to_string(bk);
        benchmark::RegisterBenchmark(
            name.c_str(),
            [=](benchmark::State& st) {
              run_attention(st, "flash_attn2", Backend::cpu, DType::f32, causal, {1, 16, 2048, 128}, bq, bk);
            })
            ->Unit(benchmark::kMillisecond)
            ->MeasureProcessCPUTime()
            ->UseRealTime()
            ->MinTime(0.3);
      }
}

}  // namespace

int main(int argc, char** argv) {
  return attnops::bench::benchmark_main(argc, argv, register_all);
}
