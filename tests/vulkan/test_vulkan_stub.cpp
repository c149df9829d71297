// The Vulkan backend of a build without Vulkan (ATTNOPS_WITH_VULKAN=OFF, or no loader / glslc):
// backends/vulkan/vulkan_stub.cpp and vk_paged_stub.cpp. This program links the stub's objects
// ahead of the library in every build, so their definitions are the ones it calls (the linker
// then takes none of the real backend's objects from the archive): the stub is tested where
// Vulkan is built too, instead of a test that skips whenever the real backend is compiled in.
#include <gtest/gtest.h>

#include <string>

#include "attnops/ext/problem.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

TEST(VulkanStub, ReportsWhyTheBackendIsUnavailable) {
  EXPECT_FALSE(vulkan::compiled_in());
  const Availability a = vulkan::availability(software_ok());
  EXPECT_FALSE(a.available);
  EXPECT_NE(a.detail.find("built without Vulkan"), std::string::npos) << a.detail;
  EXPECT_FALSE(vulkan::available(software_ok()));
  EXPECT_TRUE(vulkan::list_devices(software_ok()).empty());
  Case c = make_case(Spec().shape(1, 3, 5), 1);
  AttentionProblem p = problem_for(c);
  const auto reason = vulkan::check_inputs(vulkan::Kernel::vanilla, p, software_ok());
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(reason->code, ReasonCode::backend_unavailable);
  AttentionBuffers b = allocate_buffers(p);
  try {
    vulkan::run(vulkan::Kernel::vanilla, p, nullptr, software_ok(), b);
    ADD_FAILURE() << "the stub's run() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::backend_unavailable) << e.what();
  }
  try {
    (void)DeviceTensor::from_host(c.q.view(), software_ok());
    ADD_FAILURE() << "the stub made a device tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::backend_unavailable) << e.what();
  }
  EXPECT_FALSE(vulkan::measure_rates(software_ok()).has_value());
}

// Under the dispatcher, a gpu that is not built is a reason, and the cpu answers.
TEST(VulkanStub, TheDispatcherRecordsWhyAndTheCpuAnswers) {
  Case c = make_case(Spec().shape(1, 9, 9).heads(2, 1).dim(8), 2);
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  cfg.gpu_allow_software = true;
  Registry r;
  register_builtin_operators(r);
  const AttentionOutput out = r.get("flash_attn2", cfg)(c.q, c.k, c.v, c.options);
  EXPECT_EQ(out.decision.backend, Backend::cpu) << out.decision.to_log_line();
  EXPECT_TRUE(out.decision.has(ReasonCode::backend_unavailable)) << out.decision.to_log_line();
  EXPECT_NE(out.decision.to_log_line().find("built without Vulkan"), std::string::npos)
      << out.decision.to_log_line();
}

}  // namespace
}  // namespace attnops::testing
