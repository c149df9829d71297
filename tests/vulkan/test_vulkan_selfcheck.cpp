// The self-check of each kernel configuration on first use (vk_selfcheck.h):
// an injected wrong answer (ATTNOPS_VK_INJECT_FAULT=wrong_result[:VARIANT]) disables the variant
// with `selftest_failed` and the error seen, and the next variant runs (right); when every variant
// fails the gpu backend is refused with reason selftest_failed and the cpu answers; the results
// are kept beside the pipeline cache, keyed by device, driver and attnops version, and read back
// by a later process; ATTNOPS_VK_SELFTEST=0 skips the check.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "attnops/ext/problem.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

#if ATTNOPS_TEST_VULKAN_BUILT
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_selfcheck.h"

namespace attnops::testing {
namespace {

namespace fs = std::filesystem;

class VulkanSelfCheck : public VulkanTest {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (IsSkipped()) return;
    vulkan::reset_selfchecks();
    unsetenv("ATTNOPS_VK_SELFTEST");
  }
  void TearDown() override {
    vulkan::debug::set_inject_fault(vulkan::debug::Fault::none);
    vulkan::debug::set_fault_variant("");
    unsetenv("ATTNOPS_VK_SELFTEST");
    vulkan::reset_selfchecks();
    VulkanTest::TearDown();
  }
  // A prefill with GQA that lavapipe runs with flash_subgroup (vk_kernel_select.cpp).
  Case subgroup_case() { return make_case(Spec().shape(1, 24, 40).heads(4, 2).dim(16).causal(true), 19); }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_F(VulkanSelfCheck, AVariantThatPassesRunsAndSaysSo) {
  Case c = subgroup_case();
  const AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));
  EXPECT_EQ(b.run.kernel.rfind("flash_subgroup", 0), 0u) << b.run.kernel;
  EXPECT_NE(b.run.kernel_detail.find("self-check passed"), std::string::npos) << b.run.kernel_detail;
  const auto results = vulkan::selfcheck_results(software_ok());
  ASSERT_FALSE(results.empty());
  bool found = false;
  for (const auto& e : results)
    found = found || (e.key.rfind("flash_subgroup f32 D16 Dv16", 0) == 0 && e.passed);
  EXPECT_TRUE(found);
}

TEST_F(VulkanSelfCheck, AWrongResultDisablesTheVariantAndTheNextRuns) {
  Case c = subgroup_case();
  const AttentionProblem p = problem_for(c);
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::wrong_result);
  vulkan::debug::set_fault_variant("flash_subgroup");
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));
  EXPECT_EQ(b.run.kernel, "flash_rowwise") << b.run.kernel_detail;
  EXPECT_NE(b.run.kernel_detail.find("flash_subgroup: selftest_failed: out[0]"), std::string::npos)
      << b.run.kernel_detail;
  // Remembered for the process: the next call passes over it without checking again.
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::none);
  AttentionBuffers again = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), again);
  EXPECT_EQ(again.run.kernel, "flash_rowwise") << again.run.kernel_detail;
}

TEST_F(VulkanSelfCheck, WhenEveryVariantFailsTheCpuAnswers) {
  Case c = subgroup_case();
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::wrong_result);  // every variant
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  cfg.gpu_allow_software = true;
  Registry r;
  register_builtin_operators(r);
  const AttentionOutput out = r.get("flash_attn2", cfg)(c.q, c.k, c.v, c.options);
  EXPECT_EQ(out.decision.backend, Backend::cpu) << out.decision.to_log_line();
  EXPECT_TRUE(out.decision.has(ReasonCode::selftest_failed)) << out.decision.to_log_line();
  EXPECT_NE(out.decision.to_log_line().find("flash_rowwise: selftest_failed"), std::string::npos)
      << out.decision.to_log_line();
  const AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  try {
    vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
    ADD_FAILURE() << "ran although no variant passed its self-check";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::gpu_error);
    EXPECT_NE(std::string(e.what()).find("selftest_failed"), std::string::npos) << e.what();
  }
}

TEST_F(VulkanSelfCheck, SkippedWithTheEnvironmentVariable) {
  setenv("ATTNOPS_VK_SELFTEST", "0", 1);
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::wrong_result);
  Case c = subgroup_case();
  const AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
  EXPECT_EQ(b.run.kernel.rfind("flash_subgroup", 0), 0u) << b.run.kernel_detail;
  EXPECT_NE(b.run.kernel_detail.find("self-check off"), std::string::npos) << b.run.kernel_detail;
  EXPECT_TRUE(vulkan::selfcheck_results(software_ok()).empty());
}

// Every variant lavapipe runs passes its check (prefill and decode, f32 and f16; the ones it
// cannot run fall back to its normal choice), and each result is recorded.
TEST_F(VulkanSelfCheck, EveryVariantThisDeviceRunsPasses) {
  const auto results = vulkan::run_selfchecks(software_ok());
  bool subgroup = false, split = false, rowwise = false, gemm = false;
  for (const auto& e : results) {
    EXPECT_TRUE(e.passed) << e.key << ": " << e.detail;
    subgroup = subgroup || e.key.rfind("flash_subgroup", 0) == 0;
    split = split || e.key.find(" split") != std::string::npos;
    rowwise = rowwise || e.key.rfind("flash_rowwise", 0) == 0;
    gemm = gemm || e.key.rfind("vanilla_gemm", 0) == 0;
  }
  EXPECT_TRUE(subgroup && split && rowwise && gemm) << results.size() << " results";
}

// The results live beside the pipeline cache: a later process (here: the registry forgotten)
// reads a failure back without running the check, and a file of another device, driver or
// attnops version is not used.
TEST_F(VulkanSelfCheck, ResultsAreCachedBesideThePipelineCache) {
  const fs::path dir = fs::temp_directory_path() / ("attnops_selfcheck_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  GpuSettings s = software_ok();
  s.pipeline_cache = (dir / "pipelines.bin").string();
  const fs::path file = s.pipeline_cache + ".selfcheck";
  Case c = subgroup_case();
  const AttentionProblem p = problem_for(c);

  vulkan::debug::set_inject_fault(vulkan::debug::Fault::wrong_result);
  vulkan::debug::set_fault_variant("flash_subgroup");
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, s, b);
  EXPECT_EQ(b.run.kernel, "flash_rowwise");
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::none);
  const std::string text = slurp(file);
  EXPECT_EQ(text.rfind("attnops-selfcheck 1\nidentity ", 0), 0u) << text;
  EXPECT_NE(text.find("driver "), std::string::npos) << text;
  EXPECT_NE(text.find("attnops "), std::string::npos) << text;
  EXPECT_NE(text.find("fail\tflash_subgroup f32 D16 Dv16"), std::string::npos) << text;
  EXPECT_NE(text.find("pass\tflash_rowwise f32 D16 Dv16"), std::string::npos) << text;

  vulkan::reset_selfchecks();  // as a new process: the failure is read back, nothing reruns
  AttentionBuffers read_back = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, s, read_back);
  EXPECT_EQ(read_back.run.kernel, "flash_rowwise") << read_back.run.kernel_detail;
  EXPECT_TRUE(within_tolerance(p, read_back));

  // Another driver version: the file is not used, the check runs again (and passes).
  std::string other = text;
  const auto at = other.find("driver ");
  other.replace(at, 7, "driver 9");
  std::ofstream(file, std::ios::trunc) << other;
  vulkan::reset_selfchecks();
  AttentionBuffers fresh = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, s, fresh);
  EXPECT_EQ(fresh.run.kernel.rfind("flash_subgroup", 0), 0u) << fresh.run.kernel_detail;
  EXPECT_NE(slurp(file).find("pass\tflash_subgroup f32 D16 Dv16"), std::string::npos) << slurp(file);
  vulkan::release();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnops::testing
#endif
