// The runtime's data path on the device: steady state (a counter of Vulkan object creations),
// pooled memory through the staging ring or the mapping, the memory budget and injected
// out-of-memory / device loss (typed gpu_error, cpu fallback under the dispatcher, recovery),
// and timestamps. Every test runs under validation with synchronization validation (fixture).
#include <string>

#include "attnops/ext/problem.h"
#include "attnops/gpu.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

using vulkan::Kernel;
namespace debug = vulkan::debug;

// Runs `kernel` on the case and checks it against the oracle; returns the run info.
RunInfo run_checked(Kernel kernel, const Case& c, bool profile = false) {
  AttentionProblem p = problem_for(c);
  p.profile = profile;
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(kernel, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b)) << c.describe();
  return b.run;
}

Config gpu_first() {
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  cfg.gpu_allow_software = true;
  return cfg;
}

// Restores the debug switches whatever a test does.
struct DebugReset {
  ~DebugReset() {
    debug::set_inject_fault(debug::Fault::none);
    debug::set_memory_limit(0);
    if (debug::force_staging()) {
      debug::set_force_staging(false);
      release_gpu();  // the next device is created with the mapping path again
    }
  }
};

using VulkanDataPath = VulkanTest;

TEST_F(VulkanDataPath, SteadyStateCreatesNoVulkanObjects) {
  const Case flash = make_case(Spec().shape(1, 128, 128).heads(2, 1).dim(64), 1);
  const Case vanilla = make_case(Spec().shape(2, 37, 50).heads(4, 2).dim(40).causal(false).sinks(), 2);
  const Case f16 = make_case(Spec().shape(1, 64, 96).heads(2, 2).dim(32).dtype(DType::f16).bias(), 3);
  // Decode: split-KV (two passes: partials, then the merge) in one submission.
  const Case decode = make_case(Spec().shape(1, 1, 700).heads(4, 1).dim(64).causal(true).sinks(), 4);
  // Every kernel variant lavapipe runs, each in its own shape class: flash_subgroup (CPU and
  // GPU tile shapes), split-KV + attn_merge, vanilla_gemm's three passes, flash_rowwise.
  vulkan::KernelOverride gpu_shape = vulkan::parse_tiles("ds=2,rpt=2,ku=8,rows=16");
  vulkan::KernelOverride rowwise, gemm;
  rowwise.variant = vulkan::Variant::flash_rowwise;
  gemm.variant = vulkan::Variant::vanilla_gemm;  // without weights vanilla runs the flash kernels
  const auto forced = [](const vulkan::KernelOverride& o, Kernel k, const Case& c) {
    debug::set_kernel_override(o);
    const RunInfo r = run_checked(k, c);
    debug::clear_kernel_override();
    return r;
  };
  int calls = 0;
  const auto round = [&] {
    EXPECT_EQ(run_checked(Kernel::flash, flash).kernel, "flash_subgroup");
    EXPECT_EQ(forced(gemm, Kernel::vanilla, vanilla).kernel, "vanilla_gemm");
    run_checked(Kernel::blocksparse, f16, /*profile=*/true);
    EXPECT_EQ(run_checked(Kernel::vanilla, decode, /*profile=*/true).kernel, "flash_subgroup+split_kv");
    EXPECT_EQ(forced(gpu_shape, Kernel::flash, flash).kernel, "flash_subgroup");
    EXPECT_EQ(forced(rowwise, Kernel::flash, vanilla).kernel, "flash_rowwise");
    calls += 6;
  };
  round();  // the shape classes run once: pipelines, memory blocks, descriptor sets, queries
  const debug::ObjectCounts before = debug::object_counts();
  calls = 0;
  for (int i = 0; i < 3; ++i) round();
  debug::ObjectCounts after = debug::object_counts();
  EXPECT_EQ(after.submissions, before.submissions + static_cast<std::uint64_t>(calls))
      << "one queue submission per call";
  after.submissions = before.submissions;
  EXPECT_EQ(after, before) << "buffers " << before.buffers << " -> " << after.buffers << ", memory "
                           << before.memory << " -> " << after.memory << ", pipelines " << before.pipelines
                           << " -> " << after.pipelines << ", descriptor pools " << before.descriptor_pools
                           << " -> " << after.descriptor_pools;
  // The first round did create what it needed (the counter counts).
  EXPECT_GT(before.pipelines, 0u);
  EXPECT_GT(before.memory, 0u);
  // Nothing leaks between calls: only the pool's own dummy slice stays handed out.
  const debug::MemoryUse use = debug::memory_use(software_ok());
  EXPECT_LE(use.live, 256u);
}

TEST_F(VulkanDataPath, StagingRingPathMatchesTheOracleAndReachesSteadyState) {
  DebugReset reset;
  release_gpu();
  debug::set_force_staging(true);  // lavapipe's memory is host-visible: force the copies
  vulkan::debug::reset_validation_counts();
  EXPECT_FALSE(debug::memory_use(software_ok()).direct_access);
  const Case c = make_case(Spec().shape(2, 45, 70).heads(4, 2).dim(48).segments().bias(true).sinks(), 4);
  const Case w = make_case(Spec().shape(1, 33, 33).heads(2, 1).dim(16).dtype(DType::bf16), 5);
  for (int i = 0; i < 2; ++i) {
    const RunInfo r = run_checked(Kernel::flash, c, true);
    EXPECT_GT(r.bytes_to_device, 0u);
    EXPECT_GT(r.bytes_to_host, 0u);
    EXPECT_NE(r.kernel_detail.find("staged copies"), std::string::npos) << r.kernel_detail;
    ASSERT_TRUE(r.timings.has_value());
    if (r.timings->device_timestamps) {
      EXPECT_GE(r.timings->upload_ms, 0.0);
    }
    Case cw = w;
    cw.options.return_weights = true;
    run_checked(Kernel::vanilla, cw);
  }
  const debug::ObjectCounts before = debug::object_counts();
  run_checked(Kernel::flash, c);
  debug::ObjectCounts after = debug::object_counts();
  after.submissions = before.submissions;
  EXPECT_EQ(after, before);
}

TEST_F(VulkanDataPath, TimestampsAroundUploadKernelsAndDownload) {
  const Case c = make_case(Spec().shape(1, 96, 96).heads(2, 2).dim(64), 6);
  const RunInfo r = run_checked(Kernel::flash, c, /*profile=*/true);
  ASSERT_TRUE(r.timings.has_value());
  const RunTimings& t = *r.timings;
  EXPECT_GT(t.wall_ms, 0.0);
  EXPECT_EQ(r.inputs, "host");
  EXPECT_EQ(r.output, "host");
  EXPECT_EQ(r.bytes_to_host, 96u * 2 * 64 * 4 + 2u * 96 * 4);  // out f32 + lse
  if (!t.device_timestamps) GTEST_SKIP() << "the device has no timestamps on its compute queue";
  ASSERT_EQ(t.passes.size(), 1u);
  EXPECT_EQ(t.passes[0].name, "flash_subgroup");
  EXPECT_GT(t.kernel_ms, 0.0);
  EXPECT_DOUBLE_EQ(t.kernel_ms, t.passes[0].ms);
  // Without profiling nothing is timed.
  EXPECT_FALSE(run_checked(Kernel::flash, c).timings.has_value());
}

TEST_F(VulkanDataPath, ProfileEnvironmentVariableTimesEveryCall) {
  setenv("ATTNOPS_PROFILE", "1", 1);
  attnops::reload_environment();
  const Case c = make_case(Spec().shape(1, 16, 16).dim(16), 7);
  Registry r;
  register_builtin_operators(r);
  const AttentionOutput out = r.get("vanilla", gpu_first())(c.q, c.k, c.v, c.options);
  unsetenv("ATTNOPS_PROFILE");
  attnops::reload_environment();
  EXPECT_EQ(out.decision.backend, Backend::gpu);
  ASSERT_TRUE(out.decision.run.timings.has_value()) << out.decision.to_json();
  EXPECT_NE(out.decision.to_json().find("\"timings\": {"), std::string::npos) << out.decision.to_json();
}

TEST_F(VulkanDataPath, OutOfMemoryIsATypedGpuErrorAndFallsBackToTheCpu) {
  DebugReset reset;
  const Case c = make_case(Spec().shape(1, 64, 64).heads(2, 1).dim(32), 8);
  AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  debug::set_inject_fault(debug::Fault::out_of_memory);
  try {
    vulkan::run(Kernel::flash, p, nullptr, software_ok(), b);
    ADD_FAILURE() << "run() did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::gpu_error) << e.what();
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
  }
  for (std::int64_t i = 0; i < b.out.numel(); ++i) ASSERT_EQ(b.out.at(static_cast<std::size_t>(i)), 0.f);
  // Under the dispatcher: the cpu runs, the decision says why.
  Registry r;
  register_builtin_operators(r);
  const AttentionOutput out = r.get("flash_attn2", gpu_first())(c.q, c.k, c.v, c.options);
  EXPECT_EQ(out.decision.backend, Backend::cpu) << out.decision.to_log_line();
  EXPECT_TRUE(out.decision.has(ReasonCode::gpu_error));
  EXPECT_NE(out.decision.to_log_line().find("out of device memory"), std::string::npos)
      << out.decision.to_log_line();
  debug::set_inject_fault(debug::Fault::none);
  run_checked(Kernel::flash, c);  // and the gpu works again
}

TEST_F(VulkanDataPath, MemoryBudgetRefusesWhatDoesNotFit) {
  DebugReset reset;
  const Case small = make_case(Spec().shape(1, 32, 32).dim(16), 9);
  run_checked(Kernel::flash, small);  // the device and its first block exist
  const std::uint64_t reserved = debug::memory_use(software_ok()).reserved;
  debug::set_memory_limit(reserved + (1u << 20));  // 1 MiB more than held
  run_checked(Kernel::flash, small);               // fits in the block already held
  // q of 40 MiB needs a block of its own: over the limit, refused before anything runs.
  Tensor q(DType::f32, {1, 10240, 8, 128}), k(DType::f32, {1, 16, 8, 128}), v(DType::f32, {1, 16, 8, 128});
  const AttentionProblem p = make_problem(q, k, v, {}, OperationMetadata{});
  AttentionBuffers b = allocate_buffers(p);
  try {
    vulkan::run(Kernel::flash, p, nullptr, software_ok(), b);
    ADD_FAILURE() << "run() did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::gpu_error) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory limit"), std::string::npos) << e.what();
  }
  EXPECT_LE(debug::memory_use(software_ok()).reserved, reserved + (1u << 20));
  debug::set_memory_limit(0);
  run_checked(Kernel::flash, small);
}

TEST_F(VulkanDataPath, DeviceLossFailsTheCallThenTheRuntimeRecovers) {
  DebugReset reset;
  const Case c = make_case(Spec().shape(1, 40, 40).heads(2, 2).dim(24), 10);
  run_checked(Kernel::flash, c);  // a device exists
  const std::uint64_t devices_before = debug::object_counts().devices;
  AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  debug::set_inject_fault(debug::Fault::device_lost);
  try {
    vulkan::run(Kernel::flash, p, nullptr, software_ok(), b);
    ADD_FAILURE() << "run() did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::gpu_error);
    EXPECT_NE(std::string(e.what()).find("VK_ERROR_DEVICE_LOST"), std::string::npos) << e.what();
  }
  debug::set_inject_fault(debug::Fault::none);
  for (std::int64_t i = 0; i < b.out.numel(); ++i) ASSERT_EQ(b.out.at(static_cast<std::size_t>(i)), 0.f);
  // The lost device is replaced by a new one on the next call.
  run_checked(Kernel::flash, c);
  EXPECT_EQ(debug::object_counts().devices, devices_before + 1);
}

TEST_F(VulkanDataPath, DeviceCapsAreQueried) {
  const std::string s = debug::device_summary(software_ok());
  EXPECT_NE(s.find("subgroup"), std::string::npos) << s;
  EXPECT_NE(s.find("timestamps"), std::string::npos) << s;
}

}  // namespace
}  // namespace attnops::testing
