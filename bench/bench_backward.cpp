// Backward (training) speed and memory through the public API, against an SGEMM ceiling and
// the forward measured in the same binary.
//
//   bench_backward --benchmark_filter=Sgemm               Eigen SGEMM 2048^3 (the ceiling proxy; the
//                                                         best ISA copy, benchkit/sgemm.h)
//   bench_backward --benchmark_filter='Forward/|Backward/'  forward and backward of the same calls
//   bench_backward --benchmark_filter=BackwardMemory      peak memory of one large causal backward
//
// Names: Backward/<op>/<backend>/<dtype>/<causal|full>/B1_H<H>_T<T>_D<D> (and Forward/...). Each
// backward row runs the forward once (with lse) outside the timing, then times
// attn.backward(q, k, v, forward, dout): the operator's own kernel on that backend (fallbacks
// off), validation and gradient allocation included. One untimed call first (both passes), so
// that the first touch of fresh gradient pages is not timed: a training step reuses memory.
//
// Counter GFLOPs_visible: Forward 4 * B * H * D * visible_pairs / time; Backward 2.5 times that
// count (the usual convention: five products q.k, dout.v, p^T dout, ds^T q, ds k for the
// forward's two), visible_pairs = T^2 (full) or T(T+1)/2 (causal). Real (wall) time; the CPU
// column is the whole process's CPU time.
//
// BackwardMemory: peak resident memory during forward + backward above the process's memory
// before the inputs were allocated (sampled from /proc/self/statm every millisecond, after
// malloc_trim), in MiB and as a ratio to the bytes of q, k, v, out, dout and the gradients.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
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

std::string shape_name(Shape s) {
  std::string r = "B";  // appended piecewise: GCC 12 warns -Wrestrict on "B" + std::string (bug 105651)
  for (auto [tag, v] : {std::pair{"", s.B}, {"_H", s.H}, {"_T", s.T}, {"_D", s.D}})
    r.append(tag).append(std::to_string(v));
  return r;
}

attnops::Attention attention_on(const std::string& op, Backend backend) {
  attnops::OperationMetadata md = attnops::registry().entry(op).defaults;
  md.backends = {backend};
  md.fallbacks = attnops::FallbackPolicy{};  // time this operator's own kernel, never vanilla
  return attnops::registry().get(op, md);
}

double forward_gflop(Shape s, bool causal) {
  const double T = static_cast<double>(s.T);
  const double pairs = causal ? T * (T + 1) / 2 : T * T;
  return 4.0 * static_cast<double>(s.B * s.H * s.D) * pairs * 1e-9;
}

// operator/backend/kernel that ran, e.g. flash_attn2/cpu/avx512bf16 (the cpu ISA tier).
std::string label(const attnops::DispatchDecision& d) {
  std::string r = d.op + "/" + std::string(attnops::backend_name(d.backend));
  if (!d.run.kernel.empty()) r += "/" + d.run.kernel;
  return r;
}

void run_pass(benchmark::State& state, const std::string& op, Backend backend, DType dt, bool causal, Shape s,
              bool backward) {
  const Tensor q = filled(dt, {s.B, s.T, s.H, s.D}, 1), k = filled(dt, {s.B, s.T, s.H, s.D}, 2),
               v = filled(dt, {s.B, s.T, s.H, s.D}, 3), dout = filled(dt, {s.B, s.T, s.H, s.D}, 4);
  const attnops::Attention attn = attention_on(op, backend);
  attnops::AttentionOptions o;
  o.causal = causal;
  o.return_lse = true;
  std::string ran;
  if (backward) {
    const attnops::AttentionOutput fwd = attn(q, k, v, o);
    attn.backward(q, k, v, fwd, dout, o);  // warm-up: first-touch page faults, block maps
    for (auto _ : state) {
      attnops::AttentionGradients g = attn.backward(q, k, v, fwd, dout, o);
      benchmark::DoNotOptimize(g.dq.data());
      if (ran.empty()) ran = label(g.decision);
    }
  } else {
    attn(q, k, v, o);  // warm-up
    for (auto _ : state) {
      attnops::AttentionOutput out = attn(q, k, v, o);
      benchmark::DoNotOptimize(out.out.data());
      if (ran.empty()) ran = label(out.decision);
    }
  }
  state.counters["GFLOPs_visible"] = benchmark::Counter((backward ? 2.5 : 1.0) * forward_gflop(s, causal),
                                                        benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(ran);
}

void register_pass(const std::string& op, Backend backend, DType dt, bool causal, Shape s, bool backward,
                   double min_time) {
  const std::string name = std::string(backward ? "Backward/" : "Forward/") + op + "/" +
                           std::string(attnops::backend_name(backend)) + "/" +
                           std::string(attnops::dtype_name(dt)) + "/" + (causal ? "causal" : "full") + "/" +
                           shape_name(s);
  benchmark::RegisterBenchmark(
      name.c_str(), [=](benchmark::State& st) { run_pass(st, op, backend, dt, causal, s, backward); })
      ->Unit(benchmark::kMillisecond)
      ->MeasureProcessCPUTime()
      ->UseRealTime()
      ->MinTime(min_time);
}

// Resident bytes of this process now.
std::int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

void BM_BackwardMemory(benchmark::State& state, const std::string& op, Shape s) {
  for (auto _ : state) {
    malloc_trim(0);
    const std::int64_t base = resident_bytes();
    std::atomic<std::int64_t> peak{base};
    std::atomic<bool> stop{false};
    std::thread sampler([&] {
      while (!stop.load()) {
        const std::int64_t r = resident_bytes();
        if (r > peak.load()) peak.store(r);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    double tensors = 0;
    {
      const Tensor q = filled(DType::f32, {s.B, s.T, s.H, s.D}, 1),
                   k = filled(DType::f32, {s.B, s.T, s.H, s.D}, 2),
                   v = filled(DType::f32, {s.B, s.T, s.H, s.D}, 3),
                   dout = filled(DType::f32, {s.B, s.T, s.H, s.D}, 4);
      const attnops::Attention attn = attention_on(op, Backend::cpu);
      attnops::AttentionOptions o;
      o.return_lse = true;
      const attnops::AttentionOutput fwd = attn(q, k, v, o);
      const attnops::AttentionGradients g = attn.backward(q, k, v, fwd, dout, o);
      benchmark::DoNotOptimize(g.dq.data());
      for (const Tensor* t : {&q, &k, &v, &fwd.out, &dout, &g.dq, &g.dk, &g.dv})
        tensors += static_cast<double>(t->nbytes());
      const std::int64_t r = resident_bytes();
      if (r > peak.load()) peak.store(r);
    }
    stop.store(true);
    sampler.join();
    const double extra = static_cast<double>(peak.load() - base);
    state.counters["peak_MiB"] = extra / (1 << 20);
    state.counters["tensors_MiB"] = tensors / (1 << 20);
    state.counters["peak_over_tensors"] = extra / tensors;
  }
}

void register_all() {
  attnops::bench::register_gemm_ceilings(2048);
  // The targets' shape first: forward and backward, causal and full, for both tiled operators.
  const Shape target{1, 16, 2048, 128};
  for (const char* op : {"flash_attn2", "blocksparse"})
    for (bool causal : {false, true})
      for (bool backward : {false, true})
        register_pass(op, Backend::cpu, DType::f32, causal, target, backward, 1.0);
  // Shapes and dtypes around it.
  std::vector<Shape> shapes;
  for (std::int64_t T : {1024, 2048, 4096})
    for (std::int64_t D : {64, 128}) shapes.push_back({1, 16, T, D});
  for (std::int64_t D : {80, 96}) shapes.push_back({1, 16, 2048, D});
  for (bool causal : {false, true}) {
    for (const Shape& s : shapes)
      if (!(s.T == 2048 && s.D == 128))
        register_pass("flash_attn2", Backend::cpu, DType::f32, causal, s, true, 0.5);
    register_pass("flash_attn2", Backend::cpu, DType::bf16, causal, target, true, 0.5);
    register_pass("vanilla", Backend::cpu, DType::f32, causal, target, true, 0.5);
    register_pass("flash_attn2", Backend::native, DType::f32, causal, {1, 4, 256, 64}, true, 0.5);
  }
  benchmark::RegisterBenchmark("BackwardMemory/blocksparse/cpu/f32/causal/B1_H8_T16384_D64",
                               [](benchmark::State& st) {
                                 BM_BackwardMemory(st, "blocksparse", {1, 8, 16384, 64});
                               })
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1)
      ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  return attnops::bench::benchmark_main(argc, argv, register_all);
}
