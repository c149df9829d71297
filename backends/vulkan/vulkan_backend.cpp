// The Vulkan backend's entry points (vulkan_backend.h): device queries, input checks, run(),
// release() and the calibration behind auto's cost rule. The launch code lives in
// vk_attention.cpp, the runtime in vk_runtime / vk_device / vk_memory / vk_batch.
#include "backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <chrono>

#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/vulkan/vk_attention.h"
#include "backends/vulkan/vk_backward.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_selfcheck.h"

namespace attnops::vulkan {

namespace {

const rt::PhysicalDevice* selected_device(const GpuSettings& settings, std::string* why) {
  const int index = rt::selected_index(settings, why);
  if (index < 0) return nullptr;
  return &rt::instance().devices()[static_cast<std::size_t>(index)];
}

}  // namespace

bool compiled_in() {
  return true;
}

std::vector<GpuDeviceInfo> list_devices(const GpuSettings& settings) {
  try {
    std::vector<GpuDeviceInfo> out = rt::list_devices(rt::instance(), settings);
    std::string why;
    const int selected = rt::selected_index(settings, &why);
    for (GpuDeviceInfo& d : out) {
      const rt::PhysicalDevice& pd = rt::instance().devices()[static_cast<std::size_t>(d.index)];
      d.kernel_variants = variant_support(rt::selection_desc(pd), build_caps());
      if (d.index == selected)
        for (const SelfCheckEntry& e : selfcheck_results(settings))
          d.selfchecks.push_back(std::string(e.passed ? "pass " : "FAIL ") + e.key + ": " + e.detail);
    }
    return out;
  } catch (const Error&) {
    return {};  // no loader / no instance: no devices
  }
}

Availability availability(const GpuSettings& settings) {
  std::string why;
  const rt::PhysicalDevice* pd = selected_device(settings, &why);
  if (pd == nullptr) return {false, why};
  return {true, "Vulkan device [" + std::to_string(pd->info.index) + "] " + pd->info.name + " (" +
                    pd->info.type + ", Vulkan " + pd->info.api_version + ")"};
}

bool available(const GpuSettings& settings) {
  std::string why;  // written only when no device qualifies
  return selected_device(settings, &why) != nullptr;
}

std::optional<Reason> check_inputs(Kernel kernel, const AttentionProblem& p, const GpuSettings& settings) {
  std::string why;
  const rt::PhysicalDevice* pd = selected_device(settings, &why);
  if (pd == nullptr) return Reason{ReasonCode::backend_unavailable, why};
  if (auto r = device_limits_reason(kernel, p, *pd)) return r;
  // The variant that will run, self-checked (vk_selfcheck.h: the check runs now if it never ran
  // on this device; the device is made only then). A device that cannot be created, or fails
  // during the check, is left to run() to report as gpu_error, which the dispatcher records
  // before the next backend runs.
  std::shared_ptr<rt::Device> dev;
  std::optional<Selection> sel;
  try {
    sel = checked_selection(kernel, p, *pd, dev, settings, &why);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::gpu_error) throw;
    return std::nullopt;
  }
  if (!sel) return Reason{ReasonCode::selftest_failed, why};
  return limits_reason(kernel, p, *pd, *sel);
}

void run(Kernel kernel, const AttentionProblem& p, const BlockMap* map, const GpuSettings& settings,
         AttentionBuffers& buffers) {
  run_attention(kernel, p, map, settings, buffers);
}

std::optional<Reason> check_backward_inputs(const BackwardProblem& bp, const GpuSettings& settings) {
  std::string why;
  const rt::PhysicalDevice* pd = selected_device(settings, &why);
  if (pd == nullptr) return Reason{ReasonCode::backend_unavailable, why};
  return backward_limits_reason(bp, *pd);
}

void run_backward(const BackwardProblem& bp, const GpuSettings& settings, GradientBuffers& grads) {
  launch_backward(bp, settings, grads);
}

void release() {
  rt::release();
}

std::optional<GpuRates> measure_rates(const GpuSettings& settings) {
  try {
    if (!availability(settings).available) return std::nullopt;
    // Calibration: flash, f32, B1 H4 T256 D64, not causal (0.5 MFLOP per head-row pair set).
    const std::int64_t B = 1, T = 256, H = 4, D = 64;
    Tensor q(DType::f32, {B, T, H, D}), k(DType::f32, {B, T, H, D}), v(DType::f32, {B, T, H, D});
    for (Tensor* t : {&q, &k, &v})
      for (std::int64_t i = 0; i < t->numel(); ++i)
        t->data_as<float>()[i] = static_cast<float>((i * 37) % 17) / 17.f;
    AttentionOptions o;
    o.causal = false;
    o.profile = true;
    const AttentionProblem p = make_problem(q, k, v, o, OperationMetadata{});
    GpuRates best;
    double best_kernel_ms = 0;
    for (int rep = 0; rep < 4; ++rep) {
      AttentionBuffers b = allocate_buffers(p);
      const auto t0 = std::chrono::steady_clock::now();
      run(Kernel::flash, p, nullptr, settings, b);
      const double e2e_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (rep == 0 || !b.run.timings) continue;  // the first call compiles the pipeline
      const RunTimings& t = *b.run.timings;
      const double kernel_ms = t.device_timestamps ? t.kernel_ms : t.wall_ms;
      const double up_ms = t.host_pack_ms + t.upload_ms, down_ms = t.download_ms + t.host_unpack_ms;
      if (best_kernel_ms > 0 && kernel_ms >= best_kernel_ms) continue;
      best_kernel_ms = kernel_ms;
      const double flops = attention_flops(p, static_cast<double>(T * T));
      best.gflops = flops / (std::max(kernel_ms, 1e-6) * 1e6);
      best.upload_gbps = static_cast<double>(b.run.bytes_to_device) / (std::max(up_ms, 1e-6) * 1e6);
      best.download_gbps = static_cast<double>(b.run.bytes_to_host) / (std::max(down_ms, 1e-6) * 1e6);
      best.call_us = std::max(0.0, (e2e_ms - kernel_ms - up_ms - down_ms) * 1e3);
    }
    if (best.gflops <= 0) return std::nullopt;
    return best;
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace attnops::vulkan
