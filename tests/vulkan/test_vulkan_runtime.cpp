// The Vulkan runtime: device listing and selection, availability reasons, input checks,
// validation counters (proved by planted mistakes), fault injection, the pipeline cache file.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "attnops/ext/problem.h"
#include "backends/common/block_map.h"
#if ATTNOPS_TEST_VULKAN_BUILT
#include "backends/vulkan/vk_runtime.h"
#endif
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

// Sets (or unsets, with nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

using VulkanRuntime = VulkanTest;

TEST_F(VulkanRuntime, ListsDevicesWithTheirLimits) {
  const auto devices = vulkan::list_devices(software_ok());
  ASSERT_FALSE(devices.empty());
  bool any = false;
  for (const GpuDeviceInfo& d : devices) {
    EXPECT_FALSE(d.name.empty());
    if (!d.qualifies) continue;
    any = true;
    EXPECT_GT(d.max_shared_memory, 0u) << d.name;
    EXPECT_GT(d.max_workgroup_invocations, 0u) << d.name;
    EXPECT_GT(d.subgroup_size, 0u) << d.name;
    EXPECT_GT(d.max_storage_buffer_range, 0u) << d.name;
    EXPECT_TRUE(d.why_not.empty()) << d.name;
  }
  EXPECT_TRUE(any);
  const Availability a = vulkan::availability(software_ok());
  EXPECT_TRUE(a.available);
  EXPECT_NE(a.detail.find("Vulkan device"), std::string::npos) << a.detail;
}

TEST_F(VulkanRuntime, SoftwareDevicesNeedAllowSoftware) {
  ScopedEnv env("ATTNOPS_VK_ALLOW_SOFTWARE", nullptr);
  GpuSettings strict;  // allow_software = false
  bool has_hardware = false;
  for (const GpuDeviceInfo& d : vulkan::list_devices(strict)) {
    if (d.software) {
      EXPECT_FALSE(d.qualifies) << d.name;
      EXPECT_NE(d.why_not.find("allow_software"), std::string::npos) << d.why_not;
      EXPECT_NE(d.why_not.find("lavapipe"), std::string::npos) << d.why_not;
    } else if (d.qualifies) {
      has_hardware = true;
    }
  }
  const Availability a = vulkan::availability(strict);
  if (has_hardware) GTEST_SKIP() << "a hardware device qualifies: " << a.detail;
  EXPECT_FALSE(a.available);
  EXPECT_NE(a.detail.find("no Vulkan device qualifies"), std::string::npos) << a.detail;
  EXPECT_NE(a.detail.find("allow_software"), std::string::npos) << a.detail;
  // check_inputs and run report the same, typed.
  Case c = make_case(Spec().shape(1, 3, 5), 1);
  AttentionProblem p = problem_for(c);
  const auto reason = vulkan::check_inputs(vulkan::Kernel::flash, p, strict);
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(reason->code, ReasonCode::backend_unavailable);
  AttentionBuffers b = allocate_buffers(p);
  try {
    vulkan::run(vulkan::Kernel::flash, p, nullptr, strict, b);
    ADD_FAILURE() << "run() without a qualifying device did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::backend_unavailable) << e.what();
  }
}

TEST_F(VulkanRuntime, DeviceSelectorByNameAndIndex) {
  GpuSettings s = software_ok();
  s.device = "no-such-device-name";
  {
    ScopedEnv env("ATTNOPS_VK_DEVICE", nullptr);
    const Availability a = vulkan::availability(s);
    EXPECT_FALSE(a.available);
    EXPECT_NE(a.detail.find("not selected"), std::string::npos) << a.detail;
    const auto devices = vulkan::list_devices(s);
    s.device = devices.front().name.substr(0, 4);  // a name substring selects it
    EXPECT_TRUE(vulkan::availability(s).available) << vulkan::availability(s).detail;
    s.device = std::to_string(devices.size());  // an index past the end selects nothing
    EXPECT_FALSE(vulkan::availability(s).available);
  }
  {
    // The environment overrides the settings.
    ScopedEnv env("ATTNOPS_VK_DEVICE", "0");
    EXPECT_TRUE(vulkan::availability(s).available);
  }
}

TEST_F(VulkanRuntime, CheckInputsRejectsWhatTheShadersCannotRun) {
  AttentionProblem p;
  p.B = 1;
  p.Tq = p.Tk = 64;
  p.Hq = p.Hkv = 1;
  p.D = p.Dv = 64;
  EXPECT_FALSE(vulkan::check_inputs(vulkan::Kernel::flash, p, software_ok()).has_value());

  p.D = 600;  // the kernels take head dims up to 512
  auto r = vulkan::check_inputs(vulkan::Kernel::flash, p, software_ok());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, ReasonCode::unsupported_feature);
  EXPECT_NE(r->detail.find("head_dim"), std::string::npos) << r->detail;

  // Weights [B, Hq, Tq, Tk] f32 of 16 * 8192 * 8192 * 4 bytes = 4 GiB fit in no storage buffer.
  p.D = p.Dv = 64;
  p.Hq = p.Hkv = 16;
  p.Tq = p.Tk = 8192;
  p.want_weights = true;
  r = vulkan::check_inputs(vulkan::Kernel::vanilla, p, software_ok());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, ReasonCode::unsupported_feature);
  EXPECT_NE(r->detail.find("maxStorageBufferRange"), std::string::npos) << r->detail;
  // Without weights vanilla needs no scores buffer (it runs the one-pass shader), nor does flash.
  p.want_weights = false;
  EXPECT_FALSE(vulkan::check_inputs(vulkan::Kernel::vanilla, p, software_ok()).has_value());
  EXPECT_FALSE(vulkan::check_inputs(vulkan::Kernel::flash, p, software_ok()).has_value());

  p.Hq = p.Hkv = 1;
  p.Tq = p.Tk = 16;
  p.want_weights = true;
  r = vulkan::check_inputs(vulkan::Kernel::blocksparse, p, software_ok());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, ReasonCode::unsupported_feature);
  EXPECT_FALSE(vulkan::check_inputs(vulkan::Kernel::vanilla, p, software_ok()).has_value());
}

// With the planned buffer range capped at 16 KiB, small problems reach the size limits.
TEST_F(VulkanRuntime, BuffersOverTheRangeAreRejectedOrAvoided) {
  struct Uncap {
    ~Uncap() { vulkan::debug::set_max_buffer_bytes(0); }
  } uncap;
  vulkan::debug::set_max_buffer_bytes(16 * 1024);
  // Scores [1, 4, 40, 50] f32 = 32 KiB: over the cap; q, k, v are under it.
  Case c = make_case(Spec().shape(1, 40, 50).heads(4, 1).dim(16).causal(false).sinks(), 11);
  AttentionProblem p = problem_for(c);
  EXPECT_FALSE(vulkan::check_inputs(vulkan::Kernel::vanilla, p, software_ok()).has_value());
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::vanilla, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));

  c.options.return_weights = true;  // the weights must be materialised: rejected, and run() says so
  p = problem_for(c);
  auto r = vulkan::check_inputs(vulkan::Kernel::vanilla, p, software_ok());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, ReasonCode::unsupported_feature);
  EXPECT_NE(r->detail.find("weights"), std::string::npos) << r->detail;
  b = allocate_buffers(p);
  try {
    vulkan::run(vulkan::Kernel::vanilla, p, nullptr, software_ok(), b);
    ADD_FAILURE() << "run() did not reject the weights";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported_feature) << e.what();
  }

  // q [1, 40, 4, 64] f32 = 40 KiB: over the cap for every kernel.
  p = problem_for(make_case(Spec().shape(1, 40, 50).heads(4, 1).dim(64), 12));
  r = vulkan::check_inputs(vulkan::Kernel::flash, p, software_ok());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, ReasonCode::unsupported_feature);
  EXPECT_NE(r->detail.find("q needs"), std::string::npos) << r->detail;
}

// The counters are only worth trusting if they see a mistake that is planted on purpose.
TEST_F(VulkanRuntime, ValidationCountsAPlantedInvalidCall) {
  if (!vulkan::debug::validation_enabled()) GTEST_SKIP() << "validation layer not available";
  vulkan::debug::plant_mistake(vulkan::debug::Mistake::invalid_usage, software_ok());
  const auto c = vulkan::debug::validation_counts();
  EXPECT_GE(c.errors, 1u);
  EXPECT_NE(joined_validation_messages().find("VUID-VkBufferCreateInfo-size"), std::string::npos)
      << joined_validation_messages();
  vulkan::debug::reset_validation_counts();  // planted: not a failure of this test
}

TEST_F(VulkanRuntime, SynchronizationValidationCountsAPlantedHazard) {
  if (!vulkan::debug::validation_enabled()) GTEST_SKIP() << "validation layer not available";
  vulkan::debug::plant_mistake(vulkan::debug::Mistake::sync_hazard, software_ok());
  const auto c = vulkan::debug::validation_counts();
  EXPECT_GE(c.sync_hazards, 1u) << joined_validation_messages();
  EXPECT_NE(joined_validation_messages().find("SYNC-HAZARD-READ"), std::string::npos)
      << joined_validation_messages();
  vulkan::debug::reset_validation_counts();
}

TEST_F(VulkanRuntime, InjectedFaultThrowsGpuErrorAndLeavesBuffersUntouched) {
  Case c = make_case(Spec().shape(1, 9, 13).heads(2, 1).dim(40), 7);
  AttentionProblem p = problem_for(c);
  for (auto kernel : {vulkan::Kernel::vanilla, vulkan::Kernel::flash}) {
    AttentionBuffers b = allocate_buffers(p);
    vulkan::debug::set_inject_fault(true);
    try {
      vulkan::run(kernel, p, nullptr, software_ok(), b);
      ADD_FAILURE() << "run() did not fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::gpu_error) << e.what();
      EXPECT_NE(std::string(e.what()).find("VK_ERROR_DEVICE_LOST"), std::string::npos) << e.what();
    }
    vulkan::debug::set_inject_fault(false);
    for (std::int64_t i = 0; i < b.out.numel(); ++i) ASSERT_EQ(b.out.at(static_cast<std::size_t>(i)), 0.f);
    for (std::int64_t i = 0; i < b.lse->numel(); ++i) ASSERT_EQ(b.lse->at(static_cast<std::size_t>(i)), 0.f);
    // The context survives an injected fault: the next call works.
    vulkan::run(kernel, p, nullptr, software_ok(), b);
    EXPECT_TRUE(within_tolerance(p, b));
  }
  {
    ScopedEnv env("ATTNOPS_VK_INJECT_FAULT", "1");
    EXPECT_TRUE(vulkan::debug::inject_fault_active());
  }
}

TEST_F(VulkanRuntime, FenceTimeoutIsAGpuErrorAndTheDeviceRecovers) {
  // ~50 ms of work on lavapipe against a 1 ms fence timeout.
  Case c = make_case(Spec().shape(1, 512, 512).heads(4, 1).dim(64).causal(false), 21);
  AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  {
    ScopedEnv env("ATTNOPS_VK_TIMEOUT_MS", "1");
    try {
      vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
      GTEST_SKIP() << "the device finished within 1 ms";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::gpu_error) << e.what();
      EXPECT_NE(std::string(e.what()).find("VK_TIMEOUT"), std::string::npos) << e.what();
    }
  }
  for (std::int64_t i = 0; i < b.out.numel(); ++i) ASSERT_EQ(b.out.at(static_cast<std::size_t>(i)), 0.f);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));
}

TEST_F(VulkanRuntime, PersistsThePipelineCache) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("attnops_vk_cache_" + std::to_string(::getpid()) + ".bin");
  std::filesystem::remove(path);
  GpuSettings s = software_ok();
  s.pipeline_cache = path.string();
  Case c = make_case(Spec().shape(1, 4, 4), 3);
  AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, s, b);
  EXPECT_TRUE(within_tolerance(p, b));
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_GT(std::filesystem::file_size(path), 0u);
  std::filesystem::remove(path);
}

// A device whose creation fails (every allocation refused: the runtime's first allocation is
// in the constructor) leaves nothing behind: release() after it does not crash, and the next
// call creates the device.
TEST_F(VulkanRuntime, FailedDeviceCreationLeavesNothingToRelease) {
  Case c = make_case(Spec().shape(1, 4, 4), 3);
  AttentionProblem p = problem_for(c);
  vulkan::release();
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::out_of_memory);
  for (int attempt = 0; attempt < 2; ++attempt) {
    AttentionBuffers b = allocate_buffers(p);
    try {
      vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
      ADD_FAILURE() << "the injected out-of-memory did not fail the call";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::gpu_error) << e.what();
      EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
    }
  }
  vulkan::release();  // crashed on the entry the failed creation left
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::none);
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));
}

#if ATTNOPS_TEST_VULKAN_BUILT
// The cache file reaches the driver only with a pipeline-cache header of this device and driver
// (VkPipelineCacheHeaderVersionOne); garbage, a truncated header or another device's cache is
// dropped (garbage with a warning), and nothing over kMaxPipelineCacheBytes is read.
TEST_F(VulkanRuntime, PipelineCacheFileIsCheckedBeforeTheDriverSeesIt) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("attnops_vk_seed_" + std::to_string(::getpid()) + ".bin");
  std::filesystem::remove(path);
  GpuSettings s = software_ok();
  s.pipeline_cache = path.string();
  Case c = make_case(Spec().shape(1, 4, 4), 3);
  AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, s, b);
  ASSERT_TRUE(std::filesystem::exists(path));
  const vulkan::rt::PhysicalDevice& pd =
      vulkan::rt::instance().devices()[static_cast<std::size_t>(vulkan::rt::selected_index(s, nullptr))];
  const std::string seed = vulkan::rt::pipeline_cache_seed(path.string(), pd);
  EXPECT_EQ(seed.size(), std::filesystem::file_size(path));
  vulkan::rt::PhysicalDevice other = pd;
  other.device_id ^= 1;
  EXPECT_EQ(vulkan::rt::pipeline_cache_seed(path.string(), other), "");
  other = pd;
  other.cache_uuid[3] ^= 1;
  EXPECT_EQ(vulkan::rt::pipeline_cache_seed(path.string(), other), "");
  for (const std::string& bad : {std::string(4096, 'x'), seed.substr(0, 20)}) {
    std::filesystem::remove(path);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bad.data(), 1, bad.size(), f);
    std::fclose(f);
    EXPECT_EQ(vulkan::rt::pipeline_cache_seed(path.string(), pd), "");
  }
  EXPECT_EQ(vulkan::rt::pipeline_cache_seed("/dev/zero", pd), "");
  std::filesystem::remove(path);
}
#endif

// The context is shared: concurrent calls serialise on its queue and each gets its own result.
TEST_F(VulkanRuntime, ConcurrentCallsFromManyThreads) {
  constexpr int kThreads = 4;
  std::vector<Case> cases;
  for (int t = 0; t < kThreads; ++t)
    cases.push_back(
        make_case(Spec().shape(1, 17 + t, 23 + 2 * t).heads(2, 1).dim(40).causal(t % 2 == 0), 900 + t));
  std::vector<AttentionProblem> problems;
  for (const Case& c : cases) problems.push_back(problem_for(c));
  std::vector<AttentionBuffers> results;
  for (const AttentionProblem& p : problems) results.push_back(allocate_buffers(p));
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int rep = 0; rep < 3; ++rep)
          vulkan::run(t % 2 ? vulkan::Kernel::vanilla : vulkan::Kernel::flash,
                      problems[static_cast<std::size_t>(t)], nullptr, software_ok(),
                      results[static_cast<std::size_t>(t)]);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[static_cast<std::size_t>(t)], "") << "thread " << t;
    EXPECT_TRUE(within_tolerance(problems[static_cast<std::size_t>(t)], results[static_cast<std::size_t>(t)]))
        << "thread " << t;
  }
}

}  // namespace
}  // namespace attnops::testing
