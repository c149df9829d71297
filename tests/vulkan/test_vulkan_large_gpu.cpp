// What a large discrete GPU changes, shown on lavapipe and on an
// injected H100-like description (132 compute units, subgroup 32, 4 GiB storage-buffer range,
// host-visible device-local memory):
//  - large requests are allocated at their exact size, never rounded up by a size class past
//    maxMemoryAllocationSize, and reused for requests they fit within 25%;
//  - buffers over maxStorageBufferRange or maxMemoryAllocationSize are refused by the gate with
//    unsupported_feature (the dispatcher then runs the cpu), and a binding over the range that
//    reached a dispatch anyway is a gpu_error naming it, never a descriptor clamped in silence;
//  - on a discrete device whose memory is host-visible, uploads may write the mapping but every
//    read-back goes through the host-cached staging ring (no uncached PCIe reads).
#include <string>

#include "attnops/ext/problem.h"
#include "tests/support/testing.h"
#include "tests/vulkan/injected_devices.h"
#include "tests/vulkan/vulkan_fixture.h"

#if ATTNOPS_TEST_VULKAN_BUILT
#include "backends/vulkan/vk_attention.h"
#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_memory.h"
#include "backends/vulkan/vk_runtime.h"

namespace attnops::testing {
namespace {

using vulkan::rt::MemoryPool;

constexpr std::uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;

TEST(VulkanLargeGpu, LargeRequestsAreAllocatedAtTheirExactSize) {
  const std::uint64_t block = 64 * kMiB, align = 256;
  // Small requests: their size class (at most 25% over).
  EXPECT_EQ(MemoryPool::plan_request(1000, block, align).size,
            MemoryPool::class_size(MemoryPool::class_of(1000)));
  EXPECT_FALSE(MemoryPool::plan_request(20 * kMiB, block, align).own_block);
  // Over half a block: exactly the aligned request. A 3 GiB + 17 B buffer on a device that allows
  // 3.25 GiB per allocation would have been rounded to its 3.5 GiB class and refused as out of
  // memory; it stays 3 GiB + 256 B.
  const std::uint64_t big = 3 * kGiB + 17, max_allocation = 3 * kGiB + kGiB / 4;
  const MemoryPool::Request r = MemoryPool::plan_request(big, block, align);
  EXPECT_TRUE(r.own_block);
  EXPECT_EQ(r.size, (big + 255) / 256 * 256);
  EXPECT_GT(MemoryPool::class_size(MemoryPool::class_of(big)), max_allocation);
  EXPECT_LE(r.size, max_allocation);
}

// The gates on the H100 description: 4 GiB of range, 4 GiB per allocation.
TEST(VulkanLargeGpu, BuffersOverTheRangeOrAllocationLimitAreRefused) {
  const vulkan::rt::PhysicalDevice h100 = h100_physical();
  // q [1, 16384, 64, 512] f16 = 1 GiB: fine; [1, 65536, 64, 512] f16 = 4 GiB + : refused.
  const auto problem = [](std::int64_t T, std::int64_t H) {
    AttentionOptions o;
    o.causal = true;
    // Views of gigabytes that are never read (the gate looks at shapes only): any non-null address.
    static const std::uint16_t never_read = 0;
    const TensorView q(&never_read, DType::f16, {1, T, H, 512}), k(&never_read, DType::f16, {1, T, 8, 512});
    return make_problem(q, k, k, o, OperationMetadata{});
  };
  try {
    EXPECT_FALSE(vulkan::device_limits_reason(vulkan::Kernel::flash, problem(16384, 64), h100).has_value());
  } catch (const Error& e) {
    FAIL() << e.what();
  }
  auto why = vulkan::device_limits_reason(vulkan::Kernel::flash, problem(65536 + 512, 64), h100);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->code, ReasonCode::unsupported_feature);
  EXPECT_NE(why->detail.find("maxStorageBufferRange"), std::string::npos) << why->detail;
  // A device whose allocations are capped below its range (2 GiB): a 3 GiB buffer is refused too.
  vulkan::rt::PhysicalDevice capped = h100;
  capped.caps.max_allocation = 2 * kGiB;
  why = vulkan::device_limits_reason(vulkan::Kernel::flash, problem(49152, 64), capped);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->detail.find("maxMemoryAllocationSize"), std::string::npos) << why->detail;
}

using VulkanLargeGpuOnDevice = VulkanTest;

// On the real device: a request over half a pool block gets a block of exactly its size, which a
// later request within 25% reuses without a new allocation.
TEST_F(VulkanLargeGpuOnDevice, OwnBlocksAreExactAndReused) {
  const auto dev = vulkan::rt::device(software_ok());
  std::lock_guard<std::mutex> lock(dev->mutex());
  MemoryPool& pool = dev->memory();
  const std::uint64_t ask = 40 * kMiB + 1;
  const vulkan::rt::Slice a = pool.allocate(ask);
  EXPECT_EQ(a.cls, MemoryPool::kOwnBlock);
  EXPECT_GE(a.size, ask);
  EXPECT_LT(a.size, ask + 4096);  // not the 48 MiB class
  EXPECT_EQ(a.bytes, ask);
  pool.free(a);
  const std::uint64_t memory_before = vulkan::debug::object_counts().memory;
  const vulkan::rt::Slice b = pool.allocate(36 * kMiB);  // fits the free 40 MiB block within 25%
  EXPECT_EQ(b.buffer, a.buffer);
  EXPECT_EQ(vulkan::debug::object_counts().memory, memory_before);
  const vulkan::rt::Slice c = pool.allocate(20 * kMiB);  // would waste over 25% of it: a new block
  EXPECT_NE(c.buffer, a.buffer);
  pool.free(b);
  pool.free(c);
}

// A binding over the range is a gpu_error naming the binding (the gate normally refuses first).
TEST_F(VulkanLargeGpuOnDevice, ABindingOverTheRangeIsAnErrorNotAClamp) {
  const auto dev = vulkan::rt::device(software_ok());
  std::lock_guard<std::mutex> lock(dev->mutex());
  struct Uncap {
    ~Uncap() { vulkan::debug::set_max_buffer_bytes(0); }
  } uncap;
  vulkan::debug::set_max_buffer_bytes(64 * 1024);
  vulkan::rt::Batch batch(*dev, false);
  const vulkan::rt::Slice in = batch.scratch(128 * 1024), out = batch.scratch(1024);
  vulkan::rt::PipelineKey key;
  key.shader = vulkan::rt::ShaderId::convert;
  key.spec = {1};
  key.spec_count = 1;
  const std::uint32_t n = 256, groups[3] = {1, 1, 1};
  try {
    batch.dispatch(key, {in, out}, &n, sizeof n, groups, "convert");
    ADD_FAILURE() << "a 128 KiB binding passed a 64 KiB range";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::gpu_error);
    EXPECT_NE(std::string(e.what()).find("binding 0 of convert"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("maxStorageBufferRange"), std::string::npos) << e.what();
  }
  vulkan::debug::set_max_buffer_bytes(0);
  batch.dispatch(key, {in, out}, &n, sizeof n, groups, "convert");  // fits the real range
  batch.submit();
}

// lavapipe described as a discrete GPU (its memory is host-visible, as a resizable BAR's):
// uploads write the mapping, read-backs take the staging ring; results and device tensors
// are right.
TEST_F(VulkanLargeGpuOnDevice, DiscreteDevicesReadBackThroughTheStagingRing) {
  vulkan::release();
  vulkan::debug::DeviceOverride o;
  o.type = "discrete";
  vulkan::debug::set_device_override(o);
  struct Restore {
    ~Restore() {
      vulkan::debug::set_device_override(std::nullopt);
      vulkan::release();
    }
  } restore;
  Case c = make_case(Spec().shape(2, 40, 50).heads(4, 2).dim(16).causal(true).sinks(), 9);
  const AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));
  EXPECT_NE(b.run.kernel_detail.find("read-backs through the staging ring"), std::string::npos)
      << b.run.kernel_detail;
  EXPECT_TRUE(vulkan::debug::memory_use(software_ok()).direct_access);  // uploads still mapped
  // A device tensor round trip takes the same path.
  const Tensor host = random_tensor(DType::f32, {1, 7, 2, 8}, 3);
  const DeviceTensor t = DeviceTensor::from_host(host, software_ok());
  const Tensor back = t.to_host();
  ASSERT_EQ(back.nbytes(), host.nbytes());
  EXPECT_EQ(std::memcmp(back.data(), host.data(), host.nbytes()), 0);
}

}  // namespace
}  // namespace attnops::testing
#endif
