// The logical device: creation with every optional feature the device offers, the reusable
// submission resources (command buffer, fence, descriptor sets, timestamp queries), memory
// pools and shutdown. Pipelines: vk_pipelines.cpp.
#include "backends/vulkan/vk_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends/vulkan/vk_caps.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan::rt {

Device::Device(const PhysicalDevice& pd, const GpuSettings& settings) : pd_(pd) {
  try {
    create(settings);
  } catch (...) {
    shutdown();  // the destructor does not run for a constructor that throws
    throw;
  }
}

Device::~Device() {
  shutdown();
}

CoopMatEnables coopmat_enables(const DeviceCaps& caps, const BuildCaps& built) {
  return {caps.coopmat_khr && built.coopmat_khr, caps.coopmat_nv && built.coopmat_nv};
}

void Device::create(const GpuSettings& settings) {
  const DeviceCaps& c = pd_.caps;
  const float priority = 1.0f;
  auto qci = make<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci.queueFamilyIndex = pd_.compute_family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;

  // Optional features and extensions, enabled exactly when the device offers them, so that
  // kernels may rely on what DeviceCaps reports.
  std::vector<const char*> extensions;
  auto f11 = make<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  auto f12 = make<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  auto fsize = make<VkPhysicalDeviceSubgroupSizeControlFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES);
  auto fnv = make<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
  KhrCoopMatFeatures fkhr{};
  fkhr.sType = kStypeKhrCoopMatFeatures;
  f11.storageBuffer16BitAccess = c.storage_16bit ? VK_TRUE : VK_FALSE;
  f12.shaderFloat16 = c.shader_float16 ? VK_TRUE : VK_FALSE;
  f12.shaderInt8 = c.shader_int8 ? VK_TRUE : VK_FALSE;
  f12.storageBuffer8BitAccess = c.storage_8bit ? VK_TRUE : VK_FALSE;
  f12.vulkanMemoryModel = c.vulkan_memory_model ? VK_TRUE : VK_FALSE;
  f11.pNext = &f12;
  void** tail = &f12.pNext;
  if (c.subgroup_size_control || c.compute_full_subgroups) {
    fsize.subgroupSizeControl = c.subgroup_size_control ? VK_TRUE : VK_FALSE;
    fsize.computeFullSubgroups = c.compute_full_subgroups ? VK_TRUE : VK_FALSE;
    if (pd_.api_version < VK_API_VERSION_1_3)
      extensions.push_back(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    *tail = &fsize;
    tail = &fsize.pNext;
  }
  const CoopMatEnables coop = coopmat_enables(c, build_caps());
  if (coop.khr) {
    extensions.push_back(kKhrCoopMatExtension);
    fkhr.cooperativeMatrix = VK_TRUE;
    *tail = &fkhr;
    tail = &fkhr.pNext;
  }
  if (coop.nv) {
    extensions.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    fnv.cooperativeMatrix = VK_TRUE;
    *tail = &fnv;
    tail = &fnv.pNext;
  }
  if (c.memory_budget) extensions.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);

  auto dci = make<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
  dci.ppEnabledExtensionNames = extensions.data();
  if (pd_.api_version >= VK_API_VERSION_1_2) dci.pNext = &f11;
  check(vkCreateDevice(pd_.handle, &dci, nullptr, &device_), "vkCreateDevice");
  count_created(Created::device);
  vkGetDeviceQueue(device_, pd_.compute_family, 0, &queue_);

  auto pci = make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = pd_.compute_family;
  VkCommandPool pool = VK_NULL_HANDLE;
  check(vkCreateCommandPool(device_, &pci, nullptr, &pool), "vkCreateCommandPool");
  count_created(Created::command_pool);
  command_pool_ = Owned<VkCommandPool>(device_, pool, vkDestroyCommandPool);
  auto cai = make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  cai.commandPool = pool;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(device_, &cai, &cmd_), "vkAllocateCommandBuffers");
  count_created(Created::command_buffer);

  auto fci = make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  VkFence fence = VK_NULL_HANDLE;
  check(vkCreateFence(device_, &fci, nullptr, &fence), "vkCreateFence");
  count_created(Created::fence);
  fence_ = Owned<VkFence>(device_, fence, vkDestroyFence);

  create_pipeline_objects(settings);

  const bool direct = !(debug::force_staging() || env_flag("ATTNOPS_VK_FORCE_STAGING"));
  memory_ = std::make_unique<MemoryPool>(device_, pd_, MemoryKind::device, direct);
  staging_pool_ = std::make_unique<MemoryPool>(device_, pd_, MemoryKind::staging, true);
  staging_ = std::make_unique<StagingRing>(*staging_pool_);
  dummy_ = memory_->allocate(256);
  if (dummy_.mapped != nullptr) std::memset(dummy_.mapped, 0, 256);  // never read: zeroed for tidiness
}

void Device::shutdown() {
  if (device_ == VK_NULL_HANDLE) return;
  if (!lost()) vkDeviceWaitIdle(device_);
  if (staging_) staging_->destroy();
  {
    std::lock_guard<std::mutex> lock(hang_mu_);
    hang_event_.reset();
  }
  staging_.reset();
  staging_pool_.reset();
  memory_.reset();
  pipelines_.clear();
  modules_.clear();
  cache_.reset();
  queries_.reset();
  sets_.clear();
  descriptor_pools_.clear();
  pipeline_layout_.reset();
  set_layout_.reset();
  fence_.reset();
  command_pool_.reset();  // frees cmd_
  cmd_ = VK_NULL_HANDLE;
  vkDestroyDevice(device_, nullptr);
  device_ = VK_NULL_HANDLE;
  if (lost_reason_.empty()) lost_reason_ = "the GPU state was released (attnops::release_gpu)";
}

bool Device::wait_last_submission(std::uint64_t ns) {
  if (device_ == VK_NULL_HANDLE) return true;
  VkFence f = fence_.get();
  return vkWaitForFences(device_, 1, &f, VK_TRUE, ns) == VK_SUCCESS;
}

VkEvent Device::hang_event() {
  if (hang_event_.get() == VK_NULL_HANDLE) {
    auto eci = make<VkEventCreateInfo>(VK_STRUCTURE_TYPE_EVENT_CREATE_INFO);
    VkEvent e = VK_NULL_HANDLE;
    check(vkCreateEvent(device_, &eci, nullptr, &e), "vkCreateEvent");
    hang_event_ = Owned<VkEvent>(device_, e, vkDestroyEvent);
  }
  hang_set_ = false;
  check(vkResetEvent(device_, hang_event_.get()), "vkResetEvent");
  return hang_event_.get();
}

void Device::release_hang() {
  // vkSetEvent needs no lock but the event's (the thread that waits on the hung submission
  // holds mutex()); a set event stays set until the next hang_event().
  std::lock_guard<std::mutex> lock(hang_mu_);
  if (hang_event_.get() != VK_NULL_HANDLE && !hang_set_ && device_ != VK_NULL_HANDLE) {
    vkSetEvent(device_, hang_event_.get());
    hang_set_ = true;
  }
}

std::string Device::data_path() const {
  if (direct_reads()) return "device memory mapped (no copies)";
  if (direct_access()) return "uploads mapped, read-backs through the staging ring (discrete device)";
  return "staged copies";
}

void Device::check_usable() const {
  if (device_ == VK_NULL_HANDLE)
    throw Error(ErrorCode::gpu_error,
                "Vulkan: " + (lost_reason_.empty() ? std::string("no device") : lost_reason_));
  if (lost())
    throw Error(ErrorCode::gpu_error,
                "Vulkan: the device is unusable since an earlier failure (" + lost_reason_ + ")");
}

VkDescriptorSet Device::descriptor_set(std::uint32_t i) {
  while (i >= sets_.size()) {
    // A new pool for twice the sets so far (at least 8): sets are never freed, only rewritten.
    const std::uint32_t n = std::max<std::uint32_t>(8, static_cast<std::uint32_t>(sets_.size()));
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, n * kBindings};
    auto dpci = make<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
    dpci.maxSets = n;
    dpci.poolSizeCount = 1;
    dpci.pPoolSizes = &size;
    VkDescriptorPool pool = VK_NULL_HANDLE;
    check(vkCreateDescriptorPool(device_, &dpci, nullptr, &pool), "vkCreateDescriptorPool");
    count_created(Created::descriptor_pool);
    descriptor_pools_.emplace_back(device_, pool, vkDestroyDescriptorPool);
    std::vector<VkDescriptorSetLayout> layouts(n, set_layout_.get());
    auto dsai = make<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    dsai.descriptorPool = pool;
    dsai.descriptorSetCount = n;
    dsai.pSetLayouts = layouts.data();
    std::vector<VkDescriptorSet> sets(n);
    check(vkAllocateDescriptorSets(device_, &dsai, sets.data()), "vkAllocateDescriptorSets");
    count_created(Created::descriptor_set, n);
    sets_.insert(sets_.end(), sets.begin(), sets.end());
  }
  return sets_[i];
}

VkQueryPool Device::query_pool(std::uint32_t n) {
  if (!pd_.caps.timestamps) return VK_NULL_HANDLE;
  if (n > query_count_) {
    queries_.reset();  // not in use: only called while recording, after the last fence
    const std::uint32_t count = std::max<std::uint32_t>(n, 32);
    auto qci = make<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
    qci.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qci.queryCount = count;
    VkQueryPool q = VK_NULL_HANDLE;
    check(vkCreateQueryPool(device_, &qci, nullptr, &q), "vkCreateQueryPool");
    count_created(Created::query_pool);
    queries_ = Owned<VkQueryPool>(device_, q, vkDestroyQueryPool);
    query_count_ = count;
  }
  return queries_.get();
}

namespace {
thread_local std::uint64_t t_timeout_cap_ns = 0;  // 0: no ScopedFenceTimeout on this thread
}  // namespace

ScopedFenceTimeout::ScopedFenceTimeout(std::uint64_t ns) : saved_(t_timeout_cap_ns) {
  t_timeout_cap_ns = saved_ == 0 ? ns : std::min(saved_, ns);
}
ScopedFenceTimeout::~ScopedFenceTimeout() {
  t_timeout_cap_ns = saved_;
}

std::uint64_t Device::fence_timeout_ns() const {
  std::uint64_t timeout_ms = 120000;
  if (const std::string t = env_string("ATTNOPS_VK_TIMEOUT_MS"); !t.empty()) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
    if (end != t.c_str() && *end == '\0' && v > 0 && v < 86400000ull) timeout_ms = v;  // else the default
  }
  const std::uint64_t ns = timeout_ms * 1000000ull;
  return t_timeout_cap_ns == 0 ? ns : std::min(ns, t_timeout_cap_ns);
}

}  // namespace attnops::vulkan::rt
