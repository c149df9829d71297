// Device memory: a few large blocks (one VkDeviceMemory and one VkBuffer each) carved into
// slices by size class, so that a call in steady state allocates nothing from Vulkan; the
// memory budget (VK_EXT_memory_budget where offered) checked before each new block; and the
// persistent host-visible staging ring used when device memory is not host-visible.
// Internal to backends/vulkan.
#pragma once

#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/vulkan/vk_instance.h"
#include "backends/vulkan/vk_util.h"

namespace attnops::vulkan::rt {

// A range of one block's buffer. Bind it as (buffer, offset, size); `mapped` is the host
// address of `offset` when the pool's memory is host-visible (else null).
struct Slice {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0, size = 0;  // size: what the slice holds (its class, or its own block)
  VkDeviceSize bytes = 0;             // what was asked for (<= size): a binding's used range
  std::byte* mapped = nullptr;
  std::uint32_t block = 0, cls = 0;  // cls == kOwnBlock: a block of its own (large requests)
  bool valid() const { return buffer != VK_NULL_HANDLE; }
};

enum class MemoryKind {
  device,   // DEVICE_LOCAL (host-visible too where that is cheap: UMA, lavapipe, resizable BAR)
  staging,  // HOST_VISIBLE, coherent and cached where available (uploads and read-backs)
};

class MemoryPool {
 public:
  // `allow_host_visible`: whether device memory may be used through its host mapping (the
  // "copy skipped" path); false forces the staging path even where the mapping exists.
  MemoryPool(VkDevice dev, const PhysicalDevice& pd, MemoryKind kind, bool allow_host_visible);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A slice of at least `bytes`, aligned for storage-buffer offsets: rounded up to its size class
  // when it is at most half a block, else a block of its own of exactly the aligned size (a
  // class's 25% rounding could push a legal multi-GiB buffer past maxMemoryAllocationSize),
  // reused for later requests it fits within 25%. Throws Error(gpu_error) "Vulkan: out of device
  // memory: ..." when the budget or the driver refuses a new block (after returning unused
  // blocks and trying once more).
  Slice allocate(VkDeviceSize bytes);
  static constexpr std::uint32_t kOwnBlock = UINT32_MAX;
  // The size of the memory a request of `bytes` takes, and whether it gets a block of its own
  // (pure: a block of `block_size`, offsets aligned to `align`).
  struct Request {
    VkDeviceSize size;
    bool own_block;
  };
  static Request plan_request(VkDeviceSize bytes, VkDeviceSize block_size, VkDeviceSize align);
  // Returns a slice to its class's free list (no Vulkan call).
  void free(const Slice& s);
  // Destroys every block (the owner guarantees the device is idle).
  void destroy_all();

  bool host_visible() const { return host_visible_; }
  // For non-coherent memory: make host writes visible to the device / device writes to the
  // host, over [offset, offset + size) of the slice (no-ops for coherent memory).
  void flush(const Slice& s, VkDeviceSize offset, VkDeviceSize size) const;
  void invalidate(const Slice& s, VkDeviceSize offset, VkDeviceSize size) const;
  std::uint64_t reserved_bytes() const { return reserved_; }  // in blocks
  std::uint64_t live_bytes() const { return live_; }          // in allocated slices
  std::uint32_t heap() const { return heap_; }

  // The size classes: 256 B and up, four per power of two (at most 25% rounding waste).
  static std::uint32_t class_of(VkDeviceSize bytes);
  static VkDeviceSize class_size(std::uint32_t cls);

 private:
  struct Block {
    Owned<VkDeviceMemory> memory;  // declared first: destroyed after the buffer bound to it
    Owned<VkBuffer> buffer;
    VkDeviceSize size = 0, used = 0;
    std::byte* mapped = nullptr;
    std::uint64_t live = 0;  // slices handed out and not freed
    bool dead = false;       // destroyed by trim(); the index stays so slices keep their block ids
  };
  std::uint32_t new_block(VkDeviceSize bytes);  // index; throws out of memory
  void check_budget(VkDeviceSize bytes) const;
  bool trim();  // destroys blocks without live slices; true if any was destroyed
  void range(const Slice& s, VkDeviceSize offset, VkDeviceSize size, VkMappedMemoryRange& r) const;

  VkDevice dev_;
  const PhysicalDevice& pd_;
  MemoryKind kind_;
  std::uint32_t type_ = UINT32_MAX, heap_ = 0;
  bool host_visible_ = false, coherent_ = true;
  VkDeviceSize block_size_ = 0, align_ = 256;
  std::vector<Block> blocks_;
  std::vector<std::vector<Slice>> free_;  // by class
  std::vector<Slice> free_own_;           // free blocks of their own (large requests)
  std::uint64_t reserved_ = 0, live_ = 0;
};

// The persistent staging memory of one device: one slice, reused by every submission; a
// submission that needs more takes extra slices, and the next reset() replaces them by one
// slice of the total, so the ring only grows and a steady state allocates nothing.
class StagingRing {
 public:
  explicit StagingRing(MemoryPool& pool) : pool_(pool) {}
  // A range of `bytes` for this submission (16-byte aligned): a slice view with `mapped` set.
  Slice take(VkDeviceSize bytes);
  // After the submission's fence: everything taken is free again.
  void reset();
  void destroy() { chunks_.clear(); }
  // Returns every chunk to the pool (after a failed reset()); the next take() starts afresh.
  void destroy_chunks();

 private:
  MemoryPool& pool_;
  std::vector<Slice> chunks_;
  VkDeviceSize used_ = 0, total_ = 0;  // in the last chunk / over all chunks this submission
};

}  // namespace attnops::vulkan::rt
