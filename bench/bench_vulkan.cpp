// The Vulkan backend's speed through the public API (forward_gpu), on whatever device qualifies;
// lavapipe is allowed here, so on a host without a GPU this measures the software rasterizer,
// a correctness target that is not expected to be fast (see ../shared/design/anchors.md).
//
//   bench_vulkan --benchmark_filter=VulkanSgemm/       SGEMM N^3 shader (the device's ceiling proxy)
//   bench_vulkan --benchmark_filter=VulkanAttention/
//   bench_vulkan --benchmark_filter=VulkanKernel/      one shape, every kernel variant the device runs
//
// Names: VulkanAttention/<op>/<dtype>/<causal|full>/B1_H<H>_T<T>_D<D> (the variant the selection
// takes), VulkanKernel/<variant>/<dtype>/<causal|full>/B1_H8_T512_D64 (a variant forced through
// vulkan::debug::set_kernel_override: flash_rowwise is the first kernel, the baseline the tiled
// kernels are measured against; compare rows of the same run). Every call goes through
// attnops::registry().get(op, metadata) with metadata.backends = {gpu}, gpu.allow_software = true
// and the operator's fallbacks off; upload, dispatch and read back are inside the timing (what a
// user gets). The label names the operator, the backend and the kernel variant that really ran (a
// benchmark that did not run on the gpu says so and is skipped). The pipelines are created by the
// warm-up call, outside the timing.
//
// Counter GFLOPs (Sgemm): 2 * N^3 / time, upload and read back included.
// Counter GFLOPs_visible: 4 * B * Hq * D * visible_pairs / time (2 flops per multiply-add, two
// products q.k and p.v, D == Dv): T^2 pairs for full, T(T+1)/2 for causal.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "backends/vulkan/vulkan_debug.h"
#include "backends/vulkan/vulkan_sgemm.h"
#include "bench/bench_inputs.h"
#include "bench/bench_main.h"

namespace {

using attnops::Backend;
using attnops::DType;
using attnops::Tensor;

using attnops::bench::filled;

struct Shape {
  std::int64_t B, H, T, D;
};

void run_attention(benchmark::State& state, const std::string& op, DType dt, bool causal, Shape s,
                   std::optional<attnops::vulkan::Variant> force = std::nullopt) {
  const Tensor q = filled(dt, {s.B, s.T, s.H, s.D}, 1), k = filled(dt, {s.B, s.T, s.H, s.D}, 2),
               v = filled(dt, {s.B, s.T, s.H, s.D}, 3);
  attnops::OperationMetadata md = attnops::registry().entry(op).defaults;
  md.backends = {Backend::gpu};
  md.gpu.allow_software = true;
  md.fallbacks = attnops::FallbackPolicy{};
  const attnops::Attention attn = attnops::registry().get(op, md);
  attnops::AttentionOptions opt;
  opt.causal = causal;
  const attnops::DispatchDecision plan = attn.explain(q, k, v, opt);
  if (plan.backend != Backend::gpu) {
    state.SkipWithError(("not on the gpu: " + plan.to_log_line()).c_str());
    return;
  }
  attnops::vulkan::KernelOverride o;
  o.variant = force;
  attnops::vulkan::debug::set_kernel_override(o);
  const attnops::AttentionOutput warm = attn(q, k, v, opt);  // creates the pipelines
  if (force && warm.decision.run.kernel.rfind(attnops::vulkan::variant_name(*force), 0) != 0) {
    attnops::vulkan::debug::clear_kernel_override();
    state.SkipWithError(("the device cannot run " + std::string(attnops::vulkan::variant_name(*force)) +
                         ": " + warm.decision.run.kernel_detail)
                            .c_str());
    return;
  }
  for (auto _ : state) {
    attnops::AttentionOutput out = attn(q, k, v, opt);
    benchmark::DoNotOptimize(out.out.data());
  }
  attnops::vulkan::debug::clear_kernel_override();
  const double T = static_cast<double>(s.T);
  const double pairs = causal ? T * (T + 1) / 2 : T * T;
  state.counters["GFLOPs_visible"] =
      benchmark::Counter(4.0 * static_cast<double>(s.B * s.H * s.D) * pairs * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(plan.op + "/" + std::string(attnops::backend_name(plan.backend)) + "/" +
                 warm.decision.run.kernel);
}

void BM_VulkanSgemm(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const Tensor a = filled(DType::f32, {n, n}, 1), b = filled(DType::f32, {n, n}, 2);
  Tensor c(DType::f32, {n, n});
  attnops::GpuSettings gpu;
  gpu.allow_software = true;
  try {
    for (auto _ : state) {
      attnops::vulkan::sgemm(a.data_as<float>(), b.data_as<float>(), c.data_as<float>(), n, n, n, gpu);
      benchmark::DoNotOptimize(c.data());
    }
  } catch (const attnops::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  const double nd = static_cast<double>(n);
  state.counters["GFLOPs"] =
      benchmark::Counter(2.0 * nd * nd * nd * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_VulkanSgemm)
    ->Name("VulkanSgemm")
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void register_all() {
  // On lavapipe: the tiled flash kernel against the first one, B1 H8 T512 D64 f32.
  for (auto variant :
       {attnops::vulkan::Variant::flash_rowwise, attnops::vulkan::Variant::flash_subgroup,
        attnops::vulkan::Variant::flash_coopmat_nv, attnops::vulkan::Variant::flash_coopmat_khr})
    for (DType dt : {DType::f32, DType::f16})
      for (bool causal : {false, true}) {
        const std::string name = std::string("VulkanKernel/") + attnops::vulkan::variant_name(variant) + "/" +
                                 std::string(attnops::dtype_name(dt)) + (causal ? "/causal" : "/full") +
                                 "/B1_H8_T512_D64";
        benchmark::RegisterBenchmark(
            name.c_str(),
            [=](benchmark::State& st) {
              run_attention(st, "flash_attn2", dt, causal, Shape{1, 8, 512, 64}, variant);
            })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->MinTime(0.5);
      }
  const Shape shapes[] = {{1, 4, 128, 64}, {1, 4, 512, 64}, {1, 4, 512, 128}, {1, 8, 1024, 64}};
  for (const char* op : {"vanilla", "flash_attn2"})
    for (DType dt : {DType::f32, DType::f16})
      for (bool causal : {true, false})
        for (const Shape& s : shapes) {
          const std::string name = std::string("VulkanAttention/") + op + "/" +
                                   std::string(attnops::dtype_name(dt)) + (causal ? "/causal/" : "/full/") +
                                   "B" + std::to_string(s.B) + "_H" + std::to_string(s.H) + "_T" +
                                   std::to_string(s.T) + "_D" + std::to_string(s.D);
          benchmark::RegisterBenchmark(name.c_str(),
                                       [=](benchmark::State& st) { run_attention(st, op, dt, causal, s); })
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime()
              ->MinTime(0.2);
        }
}

}  // namespace

int main(int argc, char** argv) {
  return attnops::bench::benchmark_main(argc, argv, register_all);
}
