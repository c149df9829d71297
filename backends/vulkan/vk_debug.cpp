// The test-visible diagnostics of vulkan_debug.h over the runtime's counters.
#include <atomic>
#include <cctype>
#include <mutex>

#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan::debug {

namespace {
std::atomic<int> g_fault{0};
std::atomic<std::uint64_t> g_max_buffer_bytes{0}, g_memory_limit{0};
std::atomic<bool> g_force_staging{false};
std::mutex g_override_mu;
KernelOverride g_override;
std::optional<DeviceOverride> g_device_override;
std::string g_fault_variant;
}  // namespace

bool validation_enabled() {
  try {
    return rt::instance().validation();
  } catch (const Error&) {
    return false;
  }
}

ValidationCounts validation_counts() {
  return rt::message_counts();
}
std::vector<std::string> validation_messages() {
  return rt::recent_messages();
}
void reset_validation_counts() {
  rt::reset_message_counts();
}

void set_inject_fault(Fault f) {
  g_fault = static_cast<int>(f);
}
Fault injected_fault() {
  if (g_fault != 0) return static_cast<Fault>(g_fault.load());
  std::string v = rt::env_string("ATTNOPS_VK_INJECT_FAULT");
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "oom" || v == "out_of_memory") return Fault::out_of_memory;
  if (v == "hang" || v.rfind("hang:", 0) == 0) return Fault::hang;
  if (v.rfind("wrong_result", 0) == 0) return Fault::wrong_result;
  if (rt::env_flag("ATTNOPS_VK_INJECT_FAULT") || v == "device_lost") return Fault::device_lost;
  return Fault::none;
}

void set_fault_variant(const std::string& variant) {
  std::lock_guard<std::mutex> lock(g_override_mu);
  g_fault_variant = variant;
}
std::string fault_variant() {
  {
    std::lock_guard<std::mutex> lock(g_override_mu);
    if (!g_fault_variant.empty()) return g_fault_variant;
  }
  const std::string v = rt::env_string("ATTNOPS_VK_INJECT_FAULT");
  const auto colon = v.find(':');
  return colon == std::string::npos ? "" : v.substr(colon + 1);
}
bool fault_applies_to(const std::string& variant) {
  const std::string only = fault_variant();
  return only.empty() || only == variant;
}

void release_injected_hangs() {
  rt::release_hangs();
}
bool inject_fault_active() {
  return injected_fault() != Fault::none;
}

void set_max_buffer_bytes(std::uint64_t bytes) {
  g_max_buffer_bytes = bytes;
}
std::uint64_t max_buffer_bytes() {
  return g_max_buffer_bytes;
}
void set_memory_limit(std::uint64_t bytes) {
  g_memory_limit = bytes;
}
std::uint64_t memory_limit() {
  return g_memory_limit;
}
void set_force_staging(bool on) {
  g_force_staging = on;
}
bool force_staging() {
  return g_force_staging;
}

ObjectCounts object_counts() {
  using rt::Created;
  ObjectCounts c;
  c.devices = rt::created(Created::device);
  c.buffers = rt::created(Created::buffer);
  c.memory = rt::created(Created::memory);
  c.descriptor_pools = rt::created(Created::descriptor_pool);
  c.descriptor_sets = rt::created(Created::descriptor_set);
  c.command_pools = rt::created(Created::command_pool);
  c.command_buffers = rt::created(Created::command_buffer);
  c.pipelines = rt::created(Created::pipeline);
  c.query_pools = rt::created(Created::query_pool);
  c.fences = rt::created(Created::fence);
  c.submissions = rt::created(Created::submission);
  return c;
}

MemoryUse memory_use(const GpuSettings& settings) {
  const auto dev = rt::device(settings);
  std::lock_guard<std::mutex> lock(dev->mutex());
  return {dev->memory().reserved_bytes(), dev->memory().live_bytes(), dev->direct_access()};
}

std::string device_summary(const GpuSettings& settings) {
  const auto dev = rt::device(settings);
  const rt::DeviceCaps& c = dev->caps();
  std::string s =
      dev->physical().info.name + ": subgroup " + std::to_string(c.subgroup_size) + " (" +
      std::to_string(c.min_subgroup_size) + ".." + std::to_string(c.max_subgroup_size) +
      (c.required_subgroup_size_compute ? ", requirable" : "") + "), shared " +
      std::to_string(c.max_shared_memory) + " B, invocations " + std::to_string(c.max_invocations) +
      ", f16 " + (c.shader_float16 ? "yes" : "no") + ", int8 " + (c.shader_int8 ? "yes" : "no") +
      ", coopmat khr " + std::to_string(c.coopmat_khr_shapes.size()) + " nv " +
      std::to_string(c.coopmat_nv_shapes.size()) + ", timestamps " +
      (c.timestamps ? std::to_string(c.timestamp_period_ns) + " ns" : std::string("no")) +
      ", device-local host-visible " + (c.device_local_host_visible ? "yes" : "no") + ", budget " +
      (c.memory_budget ? "yes" : "no") + ", external host memory " + (c.external_memory_host ? "yes" : "no");
  return s;
}

void set_device_override(std::optional<DeviceOverride> o) {
  std::lock_guard<std::mutex> lock(g_override_mu);
  g_device_override = std::move(o);
}
std::optional<DeviceOverride> device_override() {
  std::lock_guard<std::mutex> lock(g_override_mu);
  return g_device_override;
}

void set_kernel_override(const KernelOverride& o) {
  std::lock_guard<std::mutex> lock(g_override_mu);
  g_override = o;
}
void clear_kernel_override() {
  set_kernel_override(KernelOverride{});
}
KernelOverride kernel_override() {
  {
    std::lock_guard<std::mutex> lock(g_override_mu);
    if (!g_override.empty()) return g_override;
  }
  KernelOverride o;
  if (const std::string v = rt::env_string("ATTNOPS_VK_KERNEL"); !v.empty()) o.variant = parse_variant(v);
  if (const std::string t = rt::env_string("ATTNOPS_VK_TILES"); !t.empty()) o = parse_tiles(t, o);
  return o;
}

DeviceDesc device_desc(const GpuSettings& settings) {
  std::string why;
  const int index = rt::selected_index(settings, &why);
  if (index < 0) throw Error(ErrorCode::backend_unavailable, why);
  return rt::selection_desc(rt::instance().devices()[static_cast<std::size_t>(index)]);
}

void plant_mistake(Mistake m, const GpuSettings& settings) {
  const auto dev = rt::device(settings);
  std::lock_guard<std::mutex> lock(dev->mutex());
  VkDevice vk = dev->handle();
  if (m == Mistake::invalid_usage) {
    // size must be greater than 0 (VUID-VkBufferCreateInfo-size-00912). Drivers accept it
    // without the layer; the handle, if any, is destroyed again.
    auto bci = rt::make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
    bci.size = 0;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    VkBuffer buf = VK_NULL_HANDLE;
    if (vkCreateBuffer(vk, &bci, nullptr, &buf) == VK_SUCCESS && buf != VK_NULL_HANDLE)
      vkDestroyBuffer(vk, buf, nullptr);
    return;
  }
  // A transfer write followed by a transfer read of the same bytes with no barrier between
  // them: a read-after-write hazard that only synchronization validation reports.
  rt::Batch batch(*dev, false);
  const rt::Slice a = batch.scratch(256), b = batch.scratch(256);
  VkCommandBuffer cmd = dev->command_buffer();
  vkCmdFillBuffer(cmd, a.buffer, a.offset, 256, 0x3f800000u);
  VkBufferCopy region{a.offset, b.offset, 256};
  vkCmdCopyBuffer(cmd, a.buffer, b.buffer, 1, &region);
  batch.submit();
}

}  // namespace attnops::vulkan::debug
