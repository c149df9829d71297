// The Vulkan backend when it is not built (ATTNOPS_WITH_VULKAN=OFF, or no loader / glslc at
// configure time): no devices, never available, run() throws Error(backend_unavailable).
#include "attnops/device_tensor.h"
#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_debug.h"
#include "backends/vulkan/vulkan_sgemm.h"
#include "core/device_memory.h"

namespace attnops::vulkan {

namespace {
constexpr const char* kWhy = "built without Vulkan (ATTNOPS_WITH_VULKAN=OFF or loader/glslc not found)";
}  // namespace

bool compiled_in() {
  return false;
}
std::vector<GpuDeviceInfo> list_devices(const GpuSettings&) {
  return {};
}
Availability availability(const GpuSettings&) {
  return {false, kWhy};
}
bool available(const GpuSettings&) {
  return false;
}
std::optional<Reason> check_inputs(Kernel, const AttentionProblem&, const GpuSettings&) {
  return Reason{ReasonCode::backend_unavailable, kWhy};
}
void run(Kernel, const AttentionProblem&, const BlockMap*, const GpuSettings&, AttentionBuffers&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}
std::optional<Reason> check_backward_inputs(const BackwardProblem&, const GpuSettings&) {
  return Reason{ReasonCode::backend_unavailable, kWhy};
}
void run_backward(const BackwardProblem&, const GpuSettings&, GradientBuffers&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}

void release() {}
std::optional<GpuRates> measure_rates(const GpuSettings&) {
  return std::nullopt;
}

void sgemm(const float*, const float*, float*, std::int64_t, std::int64_t, std::int64_t, const GpuSettings&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}

namespace debug {
bool validation_enabled() {
  return false;
}
ValidationCounts validation_counts() {
  return {};
}
std::vector<std::string> validation_messages() {
  return {};
}
void reset_validation_counts() {}
void set_inject_fault(Fault) {}
Fault injected_fault() {
  return Fault::none;
}
bool inject_fault_active() {
  return false;
}
void set_memory_limit(std::uint64_t) {}
std::uint64_t memory_limit() {
  return 0;
}
void set_force_staging(bool) {}
bool force_staging() {
  return false;
}
ObjectCounts object_counts() {
  return {};
}
MemoryUse memory_use(const GpuSettings&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}
std::string device_summary(const GpuSettings&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}
void set_max_buffer_bytes(std::uint64_t) {}
std::uint64_t max_buffer_bytes() {
  return 0;
}
void set_kernel_override(const KernelOverride&) {}
void clear_kernel_override() {}
KernelOverride kernel_override() {
  return {};
}
DeviceDesc device_desc(const GpuSettings&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}
void plant_mistake(Mistake, const GpuSettings&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}
}  // namespace debug

}  // namespace attnops::vulkan

namespace attnops::vulkan {
namespace {
std::shared_ptr<DeviceStorage> no_storage(std::size_t, bool, const GpuSettings&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}
[[maybe_unused]] const bool registered = detail::register_device_allocator(&no_storage);
}  // namespace
}  // namespace attnops::vulkan
