// The test-visible diagnostics of vulkan_debug.h over the runtime's counters.
#include <atomic>
#include <mutex>

#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan::debug {

namespace {
std::atomic<bool> g_inject_fault{false};
std::atomic<std::uint64_t> g_max_buffer_bytes{0};
std::mutex g_override_mu;
KernelOverride g_override;
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

void set_inject_fault(bool on) {
  g_inject_fault = on;
}
bool inject_fault_active() {
  return g_inject_fault || rt::env_flag("ATTNOPS_VK_INJECT_FAULT");
}

void set_max_buffer_bytes(std::uint64_t bytes) {
  g_max_buffer_bytes = bytes;
}
std::uint64_t max_buffer_bytes() {
  return g_max_buffer_bytes;
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
  return rt::context(settings).physical().desc;
}

void plant_mistake(Mistake m, const GpuSettings& settings) {
  rt::Context& ctx = rt::context(settings);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  VkDevice dev = ctx.device();
  if (m == Mistake::invalid_usage) {
    // size must be greater than 0 (VUID-VkBufferCreateInfo-size-00912). Drivers accept it
    // without the layer; the handle, if any, is destroyed again.
    VkBufferCreateInfo bci = rt::make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
    bci.size = 0;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    VkBuffer buf = VK_NULL_HANDLE;
    if (vkCreateBuffer(dev, &bci, nullptr, &buf) == VK_SUCCESS && buf != VK_NULL_HANDLE)
      vkDestroyBuffer(dev, buf, nullptr);
    return;
  }
  // A transfer write followed by a transfer read of the same bytes with no barrier between
  // them: a read-after-write hazard that only synchronization validation reports.
  rt::Buffer a = ctx.make_buffer(256, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT);
  rt::Buffer b = ctx.make_buffer(256, VK_BUFFER_USAGE_TRANSFER_DST_BIT);
  ctx.submit([&](VkCommandBuffer cmd) {
    vkCmdFillBuffer(cmd, a.buffer.get(), 0, 256, 0x3f800000u);
    VkBufferCopy region{0, 0, 256};
    vkCmdCopyBuffer(cmd, a.buffer.get(), b.buffer.get(), 1, &region);
  });
}

}  // namespace attnops::vulkan::debug
