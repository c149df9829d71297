// Batch: recording, barriers, the one submission, timestamps and read-backs.
#include "backends/vulkan/vk_batch.h"

#include <algorithm>

#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan::rt {

namespace {

constexpr std::uint32_t kMaxStamps = 64;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Every earlier transfer / shader write -> every later transfer / shader access. One global
// barrier is as cheap as a precise one on current drivers and cannot miss a buffer.
void full_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src_stage, VkAccessFlags src_access) {
  auto b = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  b.srcAccessMask = src_access;
  b.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT |
                    VK_ACCESS_SHADER_WRITE_BIT;
  vkCmdPipelineBarrier(cmd, src_stage, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                       0, 1, &b, 0, nullptr, 0, nullptr);
}

constexpr VkPipelineStageFlags kWorkStages =
    VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
constexpr VkAccessFlags kWrites = VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT;

}  // namespace

Batch::Batch(Device& dev, bool profile)
    : dev_(dev), cmd_(dev.command_buffer()), profile_(profile), t0_(Clock::now()) {
  dev_.check_usable();
  check(vkResetCommandBuffer(cmd_, 0), "vkResetCommandBuffer");
  auto bi = make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
  // Earlier submissions wrote device memory this one may read or overwrite (device tensors):
  // the fence wait orders them on the host, this barrier makes their writes visible here.
  auto b = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  b.srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT;
  b.dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
  vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &b,
                       0, nullptr, 0, nullptr);
  if (profile_) {
    queries_ = dev_.query_pool(kMaxStamps);
    if (queries_ != VK_NULL_HANDLE) {
      vkCmdResetQueryPool(cmd_, queries_, 0, kMaxStamps);
      stamp();
    }
  }
}

Batch::~Batch() {
  // An abandoned (hung) device may still run this batch's work: its memory stays as it is.
  if (dev_.shut_down() || dev_.hung()) return;
  for (const Slice& s : scratch_) dev_.memory().free(s);
  try {
    dev_.staging().reset();  // may grow the ring (an allocation): never throw from here
  } catch (const Error&) {
    dev_.staging().destroy_chunks();
  }
}

void Batch::stamp() {
  if (queries_ == VK_NULL_HANDLE || stamps_ >= kMaxStamps) return;
  vkCmdWriteTimestamp(cmd_,
                      stamps_ == 0 ? VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT : VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                      queries_, stamps_);
  ++stamps_;
}

void Batch::to_phase(Phase p) {
  if (p == Phase::compute) {
    // Into the first dispatch (after uploads) or between dispatches: earlier writes -> reads.
    if (phase_ == Phase::upload || phase_ == Phase::compute || phase_ == Phase::download)
      full_barrier(cmd_, kWorkStages, kWrites);
    if (phase_ != Phase::compute) stamp_uploaded_ = stamps_, stamp();
  } else if (p != phase_ && phase_ != Phase::start) {
    full_barrier(cmd_, kWorkStages, kWrites);
  }
  if (p == Phase::download && phase_ != Phase::download) stamp_computed_ = stamps_;
  phase_ = p;
}

Slice Batch::scratch(VkDeviceSize bytes) {
  Slice s = dev_.memory().allocate(bytes);
  scratch_.push_back(s);
  return s;
}

void Batch::upload(const Slice& dst, VkDeviceSize offset, VkDeviceSize bytes,
                   const std::function<void(std::byte*)>& fill) {
  if (bytes == 0) return;
  const auto t0 = Clock::now();
  bytes_up_ += bytes;
  if (dev_.direct_access() && dst.mapped != nullptr) {
    fill(dst.mapped + offset);  // host writes before vkQueueSubmit are visible to the device
    dev_.memory().flush(dst, offset, bytes);
    host_pack_ms_ += ms_since(t0);
    return;
  }
  const Slice s = dev_.staging().take(bytes);
  fill(s.mapped);
  dev_.staging_pool().flush(s, 0, bytes);
  host_pack_ms_ += ms_since(t0);
  if (phase_ != Phase::upload) to_phase(Phase::upload);
  VkBufferCopy region{s.offset, dst.offset + offset, bytes};
  vkCmdCopyBuffer(cmd_, s.buffer, dst.buffer, 1, &region);
}

void Batch::zero(const Slice& dst, VkDeviceSize offset, VkDeviceSize bytes) {
  if (bytes == 0) return;
  if (phase_ != Phase::upload) to_phase(Phase::upload);
  vkCmdFillBuffer(cmd_, dst.buffer, dst.offset + offset, (bytes + 3) / 4 * 4, 0u);
}

void Batch::dispatch(const PipelineKey& key, std::initializer_list<Binding> bindings, const void* push,
                     std::uint32_t push_bytes, const std::uint32_t (&groups)[3], const char* label) {
  dispatch(key, std::vector<Binding>(bindings), push, push_bytes, groups, label);
}

void Batch::dispatch(const PipelineKey& key, const std::vector<Binding>& bindings, const void* push,
                     std::uint32_t push_bytes, const std::uint32_t (&groups)[3], const char* label) {
  if (bindings.size() > Device::kBindings || push_bytes > Device::kPushConstantBytes)
    throw Error(ErrorCode::internal, "Vulkan: a dispatch with too many bindings or push constants");
  const VkPipeline pipeline = dev_.pipeline(key);
  const VkDescriptorSet set = dev_.descriptor_set(dispatches_);
  VkDescriptorBufferInfo infos[Device::kBindings];
  VkWriteDescriptorSet writes[Device::kBindings];
  // A binding covers what its slice holds (rounded up to its class, or its own block) past the
  // offset, up to maxStorageBufferRange; what the kernel uses (the bytes asked for) must fit the
  // range. The gates refuse larger buffers before anything runs (vk_attention.cpp,
  // vk_backward.cpp), so a binding over it here is a bug reported as gpu_error (the next backend
  // runs), never a range clamped silently under the kernel.
  const VkDeviceSize max_range = dev_.caps().max_storage_buffer_range;
  const VkDeviceSize planning_range = debug::max_buffer_bytes() > 0
                                          ? std::min<VkDeviceSize>(max_range, debug::max_buffer_bytes())
                                          : max_range;
  for (std::uint32_t b = 0; b < Device::kBindings; ++b) {
    const Binding& bd = b < bindings.size() ? bindings.begin()[b] : Binding(dev_.dummy());
    const Slice& s = bd.slice.valid() ? bd.slice : dev_.dummy();
    const VkDeviceSize held = bd.size > 0 ? bd.size : s.size - bd.offset;
    const VkDeviceSize used = bd.size > 0 ? bd.size : (s.bytes > bd.offset ? s.bytes - bd.offset : held);
    if (used > planning_range)
      throw Error(ErrorCode::gpu_error, std::string("Vulkan: binding ") + std::to_string(b) + " of " + label +
                                            " needs " + std::to_string(used) +
                                            " bytes, over maxStorageBufferRange (" +
                                            std::to_string(planning_range) + ")");
    infos[b] = {s.buffer, s.offset + bd.offset, std::min(held, max_range)};
    writes[b] = make<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    writes[b].dstSet = set;
    writes[b].dstBinding = b;
    writes[b].descriptorCount = 1;
    writes[b].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[b].pBufferInfo = &infos[b];
  }
  vkUpdateDescriptorSets(dev_.handle(), Device::kBindings, writes, 0, nullptr);
  to_phase(Phase::compute);
  vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
  vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, dev_.pipeline_layout(), 0, 1, &set, 0,
                          nullptr);
  if (push_bytes > 0)
    vkCmdPushConstants(cmd_, dev_.pipeline_layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  vkCmdDispatch(cmd_, groups[0], groups[1], groups[2]);
  runs_kernels_ = runs_kernels_ || (groups[0] > 0 && groups[1] > 0 && groups[2] > 0);
  ++dispatches_;
  labels_.emplace_back(label);
  stamp();
}

void Batch::download(const Slice& src, VkDeviceSize offset, VkDeviceSize bytes,
                     std::function<void(const std::byte*)> consume) {
  if (bytes == 0) return;
  bytes_down_ += bytes;
  if (dev_.direct_reads() && src.mapped != nullptr) {
    downloads_.push_back({src, offset, bytes, &dev_.memory(), std::move(consume)});
    return;
  }
  to_phase(Phase::download);
  const Slice s = dev_.staging().take(bytes);
  VkBufferCopy region{src.offset + offset, s.offset, bytes};
  vkCmdCopyBuffer(cmd_, src.buffer, s.buffer, 1, &region);
  downloads_.push_back({s, 0, bytes, &dev_.staging_pool(), std::move(consume)});
}

void Batch::submit() {
  if (submitted_) throw Error(ErrorCode::internal, "Vulkan: a batch was submitted twice");
  submitted_ = true;
  if (debug::injected_fault() == debug::Fault::hang && runs_kernels_ && debug::fault_applies_to(variant_)) {
    // Test support: the queue waits, after all the work, for an event only the host sets
    // (debug::release_injected_hangs): a submission that does not finish, as a hung kernel.
    const VkEvent e = dev_.hang_event();
    vkCmdWaitEvents(cmd_, 1, &e, VK_PIPELINE_STAGE_HOST_BIT,
                    VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, nullptr, 0,
                    nullptr, 0, nullptr);
  }
  if (phase_ != Phase::download) stamp_computed_ = stamps_;
  stamp();
  // Device writes -> host reads after the fence.
  auto b = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  b.srcAccessMask = kWrites;
  b.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cmd_, kWorkStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &b, 0, nullptr, 0, nullptr);
  check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");

  VkFence fence = dev_.fence();
  check(vkResetFences(dev_.handle(), 1, &fence), "vkResetFences");
  auto si = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  VkResult r = VK_SUCCESS;
  if (debug::injected_fault() == debug::Fault::device_lost) {
    r = VK_ERROR_DEVICE_LOST;  // as a driver reports a lost device: nothing was submitted
  } else {
    r = vkQueueSubmit(dev_.queue(), 1, &si, fence);
    count_created(Created::submission);
  }
  if (r == VK_ERROR_DEVICE_LOST)
    dev_.mark_lost(std::string("vkQueueSubmit: VK_ERROR_DEVICE_LOST") +
                   (debug::injected_fault() == debug::Fault::device_lost ? " (injected)" : ""));
  check(r, debug::injected_fault() == debug::Fault::device_lost
               ? "vkQueueSubmit (injected fault: debug::set_inject_fault or ATTNOPS_VK_INJECT_FAULT)"
               : "vkQueueSubmit");
  const std::uint64_t timeout = dev_.fence_timeout_ns();
  r = vkWaitForFences(dev_.handle(), 1, &fence, VK_TRUE, timeout);
  if (r == VK_TIMEOUT) {
    // The work is still running (a hung kernel, or one slower than the timeout) and uses pooled
    // memory. vkDeviceWaitIdle has no timeout, so it is not called: the device is abandoned as
    // lost (its memory is neither freed nor reused; the runtime destroys it once that work has
    // finished, vk_runtime.cpp) and the call fails now; the next call gets a new device.
    const std::string why = "fence wait timed out after " + std::to_string(timeout / 1000000) + " ms";
    dev_.mark_hung(why + ": the device was abandoned (a hung kernel?)");
    throw Error(ErrorCode::gpu_error,
                "Vulkan: " + why +
                    " (VK_TIMEOUT); the device is abandoned and replaced on the next call; set "
                    "ATTNOPS_VK_TIMEOUT_MS to allow longer");
  }
  if (r == VK_ERROR_DEVICE_LOST) dev_.mark_lost("vkWaitForFences: VK_ERROR_DEVICE_LOST");
  check(r, "vkWaitForFences");

  timings_.host_pack_ms = host_pack_ms_;
  if (queries_ != VK_NULL_HANDLE && stamps_ >= 2) {
    std::vector<std::uint64_t> ticks(stamps_);
    if (vkGetQueryPoolResults(dev_.handle(), queries_, 0, stamps_, ticks.size() * 8, ticks.data(), 8,
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS) {
      const std::uint32_t bits = dev_.caps().timestamp_valid_bits;
      const std::uint64_t mask = bits >= 64 ? ~0ull : (1ull << bits) - 1;
      const double ms_per_tick = dev_.caps().timestamp_period_ns * 1e-6;
      const auto span = [&](std::uint32_t a, std::uint32_t b) {
        return static_cast<double>(((ticks[b] & mask) - (ticks[a] & mask)) & mask) * ms_per_tick;
      };
      const std::uint32_t last = stamps_ - 1;
      if (dispatches_ > 0) {
        timings_.upload_ms = span(0, stamp_uploaded_);
        for (std::uint32_t i = 0; i < dispatches_ && stamp_uploaded_ + i + 1 <= last; ++i) {
          const double ms = span(stamp_uploaded_ + i, stamp_uploaded_ + i + 1);
          timings_.passes.push_back({labels_[i], ms});
          timings_.kernel_ms += ms;
        }
        timings_.download_ms = span(stamp_computed_, last);
      } else {
        timings_.upload_ms = span(0, last);  // a transfer-only batch (device tensor writes, reads)
      }
      timings_.device_timestamps = true;
    }
  }
  const auto t_unpack = Clock::now();
  for (const Download& d : downloads_) {
    d.pool->invalidate(d.src, d.offset, d.bytes);
    d.consume(d.src.mapped + d.offset);
  }
  timings_.host_unpack_ms = ms_since(t_unpack);
  timings_.wall_ms = ms_since(t0_);
}

}  // namespace attnops::vulkan::rt
