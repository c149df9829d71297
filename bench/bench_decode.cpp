// Decode (q_len = 1) speed of VanillaAttn::forward_cpu against the machine's streaming-read
// bandwidth, measured in the same binary so that the ratio comes from one run; and prefill speed
// of vanilla's cpu forward against its native forward (through the registry).
//
//   bench_decode --benchmark_filter=Bandwidth     read bandwidth (sum of a 1 GiB f32 array)
//   bench_decode --benchmark_filter=Decode        decode: counters kv_GBps (K/V bytes read per
//                                                 second), GFLOPs, and pct_of_bw (kv_GBps as a
//                                                 percentage of the bandwidth measured first)
//   bench_decode --benchmark_filter=Prefill       B=1 H=16 T=1024 D=64 causal: cpu vs native
//
// Decode is memory bound: every K and V element is read once per call and used for the G q heads
// of its group, so bytes = B * Tk * Hkv * (D + Dv) * sizeof(dtype). All benchmarks use real time
// (the work runs on OpenMP threads) and OpenMP's default thread count. On a shared machine run
// with --benchmark_repetitions=5 and read the best repetition: a descheduled OpenMP thread stalls
// a whole call, so means and medians measure the neighbours.
#include <benchmark/benchmark.h>
#include <omp.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <Eigen/Core>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/vanilla_cpu.h"
#include "bench/bench_main.h"

namespace {

using attnops::DType;
using attnops::Tensor;

// Read bandwidth (GB/s) measured by BM_Bandwidth, registered first so that it runs first; the
// decode benchmarks report their K/V rate as a percentage of it (pct_of_bw; omitted when the
// filter left BM_Bandwidth out).
double g_read_gbps = 0;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Tensor filled(DType dt, std::vector<std::int64_t> shape, unsigned seed) {
  Tensor t(dt, std::move(shape));
  std::uint32_t x = seed * 2654435761u + 1u;
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;  // LCG: fast, deterministic, values in [-1, 1)
    const float f = static_cast<float>(x >> 8) / 8388608.f - 1.f;
    switch (dt) {
      case DType::f16:
        t.data_as<std::uint16_t>()[i] = attnops::float_to_half_bits(f);
        break;
      case DType::bf16:
        t.data_as<std::uint16_t>()[i] = attnops::float_to_bf16_bits(f);
        break;
      default:
        t.data_as<float>()[i] = f;
        break;
    }
  }
  return t;
}

// Sum of x[0, n): the fastest plain read of memory we know how to write here, so that the decode
// ratio is not flattered. AVX-512: four independent accumulators and software prefetch 4 KiB
// ahead (the same technique as the decode kernel; without it the loop reads ~15% slower).
// Elsewhere Eigen's vectorised sum.
float stream_sum(const float* x, std::int64_t n) {
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int l = 0; l < 4; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(x + i + 1024 + 16 * l), _MM_HINT_T0);
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
  }
  alignas(64) float lanes[16];  // (not _mm512_reduce_add_ps: GCC 12 warns inside it)
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += x[i];
  return s;
#else
  return Eigen::Map<const Eigen::ArrayXf>(x, n).sum();
#endif
}

// Streaming read: the sum of a 1 GiB f32 array with all OpenMP threads, each first-touching and
// then reading its own contiguous share.
void BM_Bandwidth(benchmark::State& state) {
  const std::int64_t n = std::int64_t{1} << 28;  // 2^28 floats = 1 GiB
  std::unique_ptr<float[]> a(new float[static_cast<std::size_t>(n)]);
  auto share = [n](int t, int nt) { return std::pair{n * t / nt, n * (t + 1) / nt}; };
#pragma omp parallel
  {
    const auto [b, e] = share(omp_get_thread_num(), omp_get_num_threads());
    for (std::int64_t i = b; i < e; ++i)
      a[static_cast<std::size_t>(i)] = static_cast<float>(i & 1023) * 1e-3f;
  }
  double total = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    double s = 0;
#pragma omp parallel reduction(+ : s)
    {
      const auto [b, e] = share(omp_get_thread_num(), omp_get_num_threads());
      s += stream_sum(a.get() + b, e - b);
    }
    total += s;
    benchmark::DoNotOptimize(total);
  }
  const double bytes = static_cast<double>(n) * sizeof(float);
  g_read_gbps = bytes * static_cast<double>(state.iterations()) * 1e-9 / seconds_since(t0);
  state.counters["GBps"] = g_read_gbps;
  state.counters["threads"] = omp_get_max_threads();
}

// A decode problem (B=1, Tq=1, causal, Hq=16, D=Dv=128) with buffers allocated once: the
// benchmark times the kernel alone, as the operator would run it after validation.
struct DecodeSetup {
  Tensor q, k, v;
  attnops::AttentionProblem p;
  attnops::AttentionBuffers buf;
  DecodeSetup(std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, DType dt)
      : q(filled(dt, {1, 1, Hq, 128}, 1)),
        k(filled(dt, {1, Tk, Hkv, 128}, 2)),
        v(filled(dt, {1, Tk, Hkv, 128}, 3)) {
    attnops::AttentionOptions o;
    o.causal = true;
    o.return_lse = true;
    p = attnops::make_problem(q, k, v, o, attnops::OperationMetadata{});
    buf = attnops::allocate_buffers(p);
  }
};

void BM_Decode(benchmark::State& state, DType dt) {
  const std::int64_t Tk = state.range(0), Hq = 16, Hkv = Hq / state.range(1);
  DecodeSetup s(Tk, Hq, Hkv, dt);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    attnops::cpu::vanilla_attention(s.p, s.buf);
    benchmark::ClobberMemory();
  }
  const double secs = seconds_since(t0), iters = static_cast<double>(state.iterations());
  const double bytes =
      static_cast<double>(Tk * Hkv * (128 + 128)) * static_cast<double>(attnops::dtype_size(dt));
  const double flops = attnops::attention_flops(s.p, static_cast<double>(Tk));
  state.counters["kv_GBps"] = bytes * iters * 1e-9 / secs;
  state.counters["GFLOPs"] = flops * iters * 1e-9 / secs;
  state.counters["kv_MiB"] = bytes / (1024.0 * 1024.0);
  if (g_read_gbps > 0) state.counters["pct_of_bw"] = 100.0 * bytes * iters * 1e-9 / secs / g_read_gbps;
  state.SetLabel(std::string(attnops::dtype_name(dt)) + " GQA " + std::to_string(state.range(1)) + ":1");
}

void decode_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kv", "group"});
  for (std::int64_t group : {1, 4})
    for (std::int64_t kv : {512, 2048, 8192, 32768}) b->Args({kv, group});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

// Prefill B=1 H=16 T=1024 D=64 causal through the registry, vanilla with backends {cpu} or
// {native}; the label is the dispatch decision, so the output shows which forward ran.
void BM_Prefill(benchmark::State& state, attnops::Backend backend) {
  const std::int64_t T = 1024, H = 16, D = 64;
  const Tensor q = filled(DType::f32, {1, T, H, D}, 4), k = filled(DType::f32, {1, T, H, D}, 5),
               v = filled(DType::f32, {1, T, H, D}, 6);
  attnops::OperationMetadata md;
  md.backends = {backend};
  const attnops::Attention attn = attnops::registry().get("vanilla", md);
  attnops::AttentionOptions o;
  o.causal = true;
  std::string decision;
  for (auto _ : state) {
    attnops::AttentionOutput out = attn(q, k, v, o);
    decision = out.decision.to_log_line();
    if (out.decision.backend != backend) {
      state.SkipWithError(("ran on another backend: " + decision).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.out.data());
  }
  const double flops = 2.0 * (D + D) * (T * (T + 1) / 2.0) * H;  // visible pairs only
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(decision);
}

}  // namespace

BENCHMARK(BM_Bandwidth)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_Decode, f32, DType::f32)->Apply(decode_args);
BENCHMARK_CAPTURE(BM_Decode, bf16, DType::bf16)->Apply(decode_args);
BENCHMARK_CAPTURE(BM_Decode, f16, DType::f16)->Apply(decode_args);
BENCHMARK_CAPTURE(BM_Prefill, cpu, attnops::Backend::cpu)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Prefill, native, attnops::Backend::native)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

int main(int argc, char** argv) {
  return attnops::bench::benchmark_main(argc, argv);
}
