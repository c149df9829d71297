// Block sub-allocation by size class, the memory budget, and the staging ring.
#include "backends/vulkan/vk_memory.h"

#include <algorithm>
#include <cmath>

#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan::rt {

namespace {

constexpr VkDeviceSize kMinClass = 256;
constexpr VkDeviceSize kBlockSize = 64ull << 20;  // blocks of 64 MiB; larger requests get their own

VkDeviceSize align_up(VkDeviceSize v, VkDeviceSize a) {
  return (v + a - 1) / a * a;
}

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

[[noreturn]] void out_of_memory(const std::string& why) {
  throw Error(ErrorCode::gpu_error, "Vulkan: out of device memory: " + why);
}

}  // namespace

std::uint32_t MemoryPool::class_of(VkDeviceSize bytes) {
  if (bytes <= kMinClass) return 0;
  // Classes: 256 * 2^(c / 4) * (4 + c % 4) / 4.
  std::uint32_t c = 0;
  while (class_size(c) < bytes) ++c;
  return c;
}

VkDeviceSize MemoryPool::class_size(std::uint32_t cls) {
  return (kMinClass << (cls / 4)) * (4 + cls % 4) / 4;
}

MemoryPool::MemoryPool(VkDevice dev, const PhysicalDevice& pd, MemoryKind kind, bool allow_host_visible)
    : dev_(dev), pd_(pd), kind_(kind) {
  VkPhysicalDeviceMemoryProperties mp{};
  vkGetPhysicalDeviceMemoryProperties(pd.handle, &mp);
  // The memory types a storage buffer with transfer usage may live in.
  auto bci = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.size = 4096;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
              VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  VkBuffer probe = VK_NULL_HANDLE;
  check(vkCreateBuffer(dev, &bci, nullptr, &probe), "vkCreateBuffer");
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(dev, probe, &req);
  vkDestroyBuffer(dev, probe, nullptr);

  std::uint64_t largest_device_heap = 0;
  for (std::uint32_t h = 0; h < mp.memoryHeapCount; ++h)
    if (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      largest_device_heap = std::max<std::uint64_t>(largest_device_heap, mp.memoryHeaps[h].size);
  const bool uma = pd.info.type == "integrated" || pd.info.type == "cpu";
  // Preference lists, best first. Device memory: host-visible device-local memory is used
  // directly (no copies) on UMA devices, or when its heap is (nearly) all of video memory
  // (resizable BAR); a small BAR window is not worth its budget.
  std::vector<VkMemoryPropertyFlags> wants;
  const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                              hc = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                              dl = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                              cached = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
  if (kind == MemoryKind::device) {
    wants = {dl | hv | hc, dl};
  } else {
    wants = {hv | hc | cached, hv | hc, hv};
  }
  for (VkMemoryPropertyFlags want : wants) {
    for (std::uint32_t t = 0; t < mp.memoryTypeCount && type_ == UINT32_MAX; ++t) {
      const VkMemoryPropertyFlags f = mp.memoryTypes[t].propertyFlags;
      if (!(req.memoryTypeBits & (1u << t)) || (f & want) != want) continue;
      if (kind == MemoryKind::device && (want & hv)) {
        const std::uint64_t heap_size = mp.memoryHeaps[mp.memoryTypes[t].heapIndex].size;
        if (!uma && heap_size * 10 < largest_device_heap * 9) continue;
      }
      type_ = t;
    }
    if (type_ != UINT32_MAX) break;
  }
  if (type_ == UINT32_MAX)
    throw Error(ErrorCode::gpu_error, std::string("Vulkan: no ") +
                                          (kind == MemoryKind::device ? "device-local" : "host-visible") +
                                          " memory type for storage buffers");
  const VkMemoryPropertyFlags f = mp.memoryTypes[type_].propertyFlags;
  heap_ = mp.memoryTypes[type_].heapIndex;
  host_visible_ = (f & hv) != 0 && (kind == MemoryKind::staging || allow_host_visible);
  coherent_ = (f & hc) != 0;
  align_ = std::max<VkDeviceSize>(
      {kMinClass, pd.caps.min_storage_offset_alignment, pd.caps.non_coherent_atom_size, req.alignment});
  block_size_ = std::min<VkDeviceSize>(kBlockSize, pd.caps.max_allocation);
}

MemoryPool::~MemoryPool() {
  destroy_all();
}

void MemoryPool::destroy_all() {
  for (Block& b : blocks_) {
    if (b.mapped != nullptr && b.memory.get() != VK_NULL_HANDLE) vkUnmapMemory(dev_, b.memory.get());
    b.buffer.reset();
    b.memory.reset();
  }
  blocks_.clear();
  free_.clear();
  free_own_.clear();
  reserved_ = live_ = 0;
}

void MemoryPool::check_budget(VkDeviceSize bytes) const {
  if (const std::uint64_t limit = debug::memory_limit(); limit > 0 && reserved_ + bytes > limit)
    out_of_memory("a new block of " + mib(bytes) + " would exceed the memory limit of " + mib(limit) + " (" +
                  mib(reserved_) + " in use; debug::set_memory_limit)");
  if (kind_ != MemoryKind::device) return;
  if (pd_.caps.memory_budget) {
    // VK_EXT_memory_budget: what this process may still use of the heap (other processes'
    // use included), refreshed on every query.
    auto budget = make<VkPhysicalDeviceMemoryBudgetPropertiesEXT>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT);
    auto mp2 = make<VkPhysicalDeviceMemoryProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2);
    mp2.pNext = &budget;
    vkGetPhysicalDeviceMemoryProperties2(pd_.handle, &mp2);
    const std::uint64_t usage = budget.heapUsage[heap_], limit = budget.heapBudget[heap_];
    if (limit > 0 && usage + bytes > limit)
      out_of_memory("a new block of " + mib(bytes) + " would exceed the heap's budget (" + mib(usage) +
                    " of " + mib(limit) + " used, VK_EXT_memory_budget)");
    return;
  }
  // Without the extension: at most 80% of the heap for this device's pools.
  const std::uint64_t heap_size = heap_ < pd_.caps.heaps.size() ? pd_.caps.heaps[heap_].size : 0;
  if (heap_size > 0 && reserved_ + bytes > heap_size / 5 * 4)
    out_of_memory("a new block of " + mib(bytes) + " would exceed 80% of the " + mib(heap_size) + " heap (" +
                  mib(reserved_) + " in use)");
}

std::uint32_t MemoryPool::new_block(VkDeviceSize bytes) {
  for (int attempt = 0;; ++attempt) {
    try {
      check_budget(bytes);
      if (bytes > pd_.caps.max_allocation)
        out_of_memory("a block of " + mib(bytes) + " exceeds maxMemoryAllocationSize (" +
                      mib(pd_.caps.max_allocation) + ")");
      Block b;
      b.size = bytes;
      auto bci = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
      bci.size = bytes;
      bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                  VK_BUFFER_USAGE_TRANSFER_DST_BIT;
      bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
      VkBuffer buf = VK_NULL_HANDLE;
      check(vkCreateBuffer(dev_, &bci, nullptr, &buf), "vkCreateBuffer");
      count_created(Created::buffer);
      b.buffer = Owned<VkBuffer>(dev_, buf, vkDestroyBuffer);
      VkMemoryRequirements req{};
      vkGetBufferMemoryRequirements(dev_, buf, &req);
      auto mai = make<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
      mai.allocationSize = req.size;
      mai.memoryTypeIndex = type_;
      VkDeviceMemory mem = VK_NULL_HANDLE;
      if (VkResult r = vkAllocateMemory(dev_, &mai, nullptr, &mem); r != VK_SUCCESS)
        throw_vk(r, "vkAllocateMemory(" + mib(req.size) + ")");
      count_created(Created::memory);
      b.memory = Owned<VkDeviceMemory>(dev_, mem, vkFreeMemory);
      check(vkBindBufferMemory(dev_, buf, mem, 0), "vkBindBufferMemory");
      if (host_visible_) {
        void* p = nullptr;
        check(vkMapMemory(dev_, mem, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
        b.mapped = static_cast<std::byte*>(p);
      }
      reserved_ += b.size;
      blocks_.push_back(std::move(b));
      return static_cast<std::uint32_t>(blocks_.size() - 1);
    } catch (const Error& e) {
      // Out of memory: give unused blocks back and try once more.
      if (attempt == 0 && std::string(e.what()).find("out of device memory") != std::string::npos && trim())
        continue;
      throw;
    }
  }
}

bool MemoryPool::trim() {
  bool any = false;
  for (std::uint32_t i = 0; i < blocks_.size(); ++i) {
    Block& b = blocks_[i];
    if (b.dead || b.live > 0) continue;
    for (auto& list : free_)
      list.erase(std::remove_if(list.begin(), list.end(), [&](const Slice& s) { return s.block == i; }),
                 list.end());
    free_own_.erase(
        std::remove_if(free_own_.begin(), free_own_.end(), [&](const Slice& s) { return s.block == i; }),
        free_own_.end());
    if (b.mapped != nullptr) vkUnmapMemory(dev_, b.memory.get());
    b.buffer.reset();
    b.memory.reset();
    b.mapped = nullptr;
    reserved_ -= b.size;
    b.dead = true;
    any = true;
  }
  return any;
}

MemoryPool::Request MemoryPool::plan_request(VkDeviceSize bytes, VkDeviceSize block_size,
                                             VkDeviceSize align) {
  const VkDeviceSize cls_size = class_size(class_of(std::max<VkDeviceSize>(bytes, 1)));
  if (cls_size <= block_size / 2) return {cls_size, false};
  return {align_up(std::max<VkDeviceSize>(bytes, 1), align), true};
}

Slice MemoryPool::allocate(VkDeviceSize bytes) {
  if (debug::injected_fault() == debug::Fault::out_of_memory)
    throw_vk(VK_ERROR_OUT_OF_DEVICE_MEMORY,
             "vkAllocateMemory (injected: debug::set_inject_fault or ATTNOPS_VK_INJECT_FAULT=oom)");
  const Request req = plan_request(bytes, block_size_, align_);
  Slice s;
  if (req.own_block) {
    // The smallest free block of its own that holds the request with at most 25% to spare.
    std::size_t best = free_own_.size();
    for (std::size_t i = 0; i < free_own_.size(); ++i) {
      const VkDeviceSize have = free_own_[i].size;
      if (have >= req.size && have <= req.size + req.size / 4 &&
          (best == free_own_.size() || have < free_own_[best].size))
        best = i;
    }
    if (best < free_own_.size()) {
      s = free_own_[best];
      free_own_.erase(free_own_.begin() + static_cast<std::ptrdiff_t>(best));
    } else {
      const std::uint32_t bi = new_block(req.size);
      Block& b = blocks_[bi];
      s.buffer = b.buffer.get();
      s.offset = 0;
      s.block = bi;
      s.size = b.size;
      b.used = b.size;
      s.mapped = b.mapped;
    }
    s.cls = kOwnBlock;
  } else {
    const std::uint32_t cls = class_of(std::max<VkDeviceSize>(bytes, 1));
    if (cls >= free_.size()) free_.resize(cls + 1);
    if (!free_[cls].empty()) {
      s = free_[cls].back();
      free_[cls].pop_back();
    } else {
      std::uint32_t bi = UINT32_MAX;
      for (std::uint32_t i = 0; i < blocks_.size() && bi == UINT32_MAX; ++i)
        if (!blocks_[i].dead && blocks_[i].size == block_size_ &&
            blocks_[i].used + req.size <= blocks_[i].size)
          bi = i;
      if (bi == UINT32_MAX) bi = new_block(block_size_);
      Block& b = blocks_[bi];
      s.buffer = b.buffer.get();
      s.offset = b.used;
      s.block = bi;
      b.used = align_up(b.used + req.size, align_);
      if (b.mapped != nullptr) s.mapped = b.mapped + s.offset;
    }
    s.cls = cls;
    s.size = req.size;
  }
  s.bytes = std::max<VkDeviceSize>(bytes, 1);
  ++blocks_[s.block].live;
  live_ += s.size;
  return s;
}

void MemoryPool::free(const Slice& s) {
  if (!s.valid() || s.block >= blocks_.size() || blocks_[s.block].dead) return;
  --blocks_[s.block].live;
  live_ -= s.size;
  if (s.cls == kOwnBlock) {
    free_own_.push_back(s);
    return;
  }
  if (s.cls >= free_.size()) free_.resize(s.cls + 1);
  free_[s.cls].push_back(s);
}

void MemoryPool::range(const Slice& s, VkDeviceSize offset, VkDeviceSize size, VkMappedMemoryRange& r) const {
  const VkDeviceSize atom = pd_.caps.non_coherent_atom_size;
  const VkDeviceSize begin = (s.offset + offset) / atom * atom;
  const VkDeviceSize end = std::min(align_up(s.offset + offset + size, atom), blocks_[s.block].size);
  r = make<VkMappedMemoryRange>(VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE);
  r.memory = blocks_[s.block].memory.get();
  r.offset = begin;
  r.size = end - begin;
}

void MemoryPool::flush(const Slice& s, VkDeviceSize offset, VkDeviceSize size) const {
  if (coherent_ || size == 0) return;
  VkMappedMemoryRange r;
  range(s, offset, size, r);
  check(vkFlushMappedMemoryRanges(dev_, 1, &r), "vkFlushMappedMemoryRanges");
}

void MemoryPool::invalidate(const Slice& s, VkDeviceSize offset, VkDeviceSize size) const {
  if (coherent_ || size == 0) return;
  VkMappedMemoryRange r;
  range(s, offset, size, r);
  check(vkInvalidateMappedMemoryRanges(dev_, 1, &r), "vkInvalidateMappedMemoryRanges");
}

Slice StagingRing::take(VkDeviceSize bytes) {
  bytes = align_up(std::max<VkDeviceSize>(bytes, 16), 16);
  if (chunks_.empty() || used_ + bytes > chunks_.back().size) {
    chunks_.push_back(pool_.allocate(std::max<VkDeviceSize>(bytes, 1ull << 20)));
    used_ = 0;
  }
  Slice s = chunks_.back();
  s.offset += used_;
  s.mapped += used_;
  s.size = s.bytes = bytes;
  used_ += bytes;
  total_ += bytes;
  return s;
}

void StagingRing::destroy_chunks() {
  for (const Slice& c : chunks_) pool_.free(c);
  chunks_.clear();
  used_ = total_ = 0;
}

void StagingRing::reset() {
  if (chunks_.size() > 1) {
    // Grow: one chunk that holds what this submission needed.
    VkDeviceSize need = 0;
    for (const Slice& c : chunks_) {
      need += c.size;
      pool_.free(c);
    }
    chunks_.clear();
    used_ = total_ = 0;
    chunks_.push_back(pool_.allocate(need));  // may throw: the ring is then empty, not broken
  }
  used_ = total_ = 0;
}

}  // namespace attnops::vulkan::rt
