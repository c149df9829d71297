// One submission: the narrow interface kernels record their work through.
//
//   std::lock_guard lock(dev.mutex());
//   Batch batch(dev, profile);                        // begins the reused command buffer
//   Slice q = batch.scratch(bytes);                   // pooled device memory, freed with the batch
//   batch.upload(q, 0, bytes, [&](std::byte* p) { pack(p); });
//   batch.dispatch(key, {q, k, v, out}, &push, sizeof push, {gx, gy, gz}, "attention");
//   batch.dispatch(key2, {...}, ...);                 // a compute->compute barrier goes between
//   batch.download(out, 0, bytes, [&](const std::byte* p) { unpack(p); });
//   batch.submit();                                   // ONE vkQueueSubmit, fence wait, read-backs
//
// Uploads and downloads go through the device's staging ring (vkCmdCopyBuffer), or straight
// through the mapping when device memory is host-visible. Everything is recorded in call order:
// uploads first, then dispatches, then downloads; barriers between the phases and between
// dispatches are inserted by the batch. With `profile`, timestamps are written around the
// uploads, each dispatch and the downloads. Internal to backends/vulkan.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "attnops/decision.h"
#include "backends/vulkan/vk_device.h"

namespace attnops::vulkan::rt {

// A binding: a slice (or a part of one: byte offset and size within it; size 0 = to its end).
struct Binding {
  Slice slice;
  VkDeviceSize offset = 0, size = 0;
  Binding(const Slice& s) : slice(s) {}  // NOLINT(google-explicit-constructor)
  Binding(const Slice& s, VkDeviceSize off, VkDeviceSize sz) : slice(s), offset(off), size(sz) {}
};

class Batch {
 public:
  // Caller holds dev.mutex(). Throws Error(gpu_error) when the device is lost or released.
  Batch(Device& dev, bool profile);
  ~Batch();  // returns the scratch slices to the pool and resets the staging ring
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  Device& device() { return dev_; }
  // The kernel variant this submission runs, for fault injection aimed at one variant
  // (debug::set_fault_variant). An injected hang applies only to a submission that dispatches
  // workgroups (one that runs no kernel cannot hang).
  void set_variant(const char* name) { variant_ = name; }
  // Device memory for this submission only (pooled; nothing is created in steady state).
  Slice scratch(VkDeviceSize bytes);
  // Host -> device: `fill` writes `bytes` bytes, which land at dst + offset.
  void upload(const Slice& dst, VkDeviceSize offset, VkDeviceSize bytes,
              const std::function<void(std::byte*)>& fill);
  // Sets `bytes` bytes at dst + offset to zero on the device (vkCmdFillBuffer).
  void zero(const Slice& dst, VkDeviceSize offset, VkDeviceSize bytes);
  // One dispatch of `key` with bindings 0.. (the rest bound to a dummy) and push constants.
  void dispatch(const PipelineKey& key, std::initializer_list<Binding> bindings, const void* push,
                std::uint32_t push_bytes, const std::uint32_t (&groups)[3], const char* label);
  void dispatch(const PipelineKey& key, const std::vector<Binding>& bindings, const void* push,
                std::uint32_t push_bytes, const std::uint32_t (&groups)[3], const char* label);
  // Device -> host: after submit() waited, `consume` reads the `bytes` bytes at src + offset.
  void download(const Slice& src, VkDeviceSize offset, VkDeviceSize bytes,
                std::function<void(const std::byte*)> consume);
  // Records the end, submits once, waits for the fence and runs the downloads' consumers.
  // Throws Error(gpu_error) (device lost, timeout): then no consumer has run.
  void submit();

  // What moved and how long it took (timestamps only with `profile` and a device that has them).
  std::uint64_t bytes_to_device() const { return bytes_up_; }
  std::uint64_t bytes_to_host() const { return bytes_down_; }
  RunTimings timings() const { return timings_; }

 private:
  enum class Phase { start, upload, compute, download };
  void to_phase(Phase p);
  void stamp();
  Device& dev_;
  VkCommandBuffer cmd_;
  bool profile_;
  Phase phase_ = Phase::start;
  bool submitted_ = false;
  const char* variant_ = "";
  bool runs_kernels_ = false;  // a dispatch of at least one workgroup was recorded
  std::uint32_t dispatches_ = 0;
  std::vector<Slice> scratch_;
  struct Download {
    Slice src;  // the staging copy, or the device slice itself when mapped
    VkDeviceSize offset, bytes;
    MemoryPool* pool;  // the slice's pool (for invalidation of non-coherent memory)
    std::function<void(const std::byte*)> consume;
  };
  std::vector<Download> downloads_;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  std::uint32_t stamps_ = 0;
  std::vector<std::string> labels_;  // per dispatch
  std::uint32_t stamp_uploaded_ = 0, stamp_computed_ = 0;
  std::uint64_t bytes_up_ = 0, bytes_down_ = 0;
  std::chrono::steady_clock::time_point t0_;
  double host_pack_ms_ = 0;
  RunTimings timings_;
};

}  // namespace attnops::vulkan::rt
