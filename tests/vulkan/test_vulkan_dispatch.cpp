// The Vulkan backend under the dispatcher: the operators' forward_gpu runs on the device when
// the config prefers gpu, a runtime gpu_error falls back to the next backend visibly, and a host
// without a qualifying device routes to the CPU with the reason recorded.
#include <cstdlib>
#include <optional>
#include <string>

#include "attnops/ext/problem.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

Config gpu_first() {
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  cfg.gpu_allow_software = true;
  return cfg;
}

// Calls `name` through a fresh registry and checks the result against the oracle.
AttentionOutput call_and_check(const std::string& name, const Config& cfg, const Case& c) {
  Registry r;
  register_builtin_operators(r);
  const Attention attn = r.get(name, cfg);
  AttentionOutput out = attn(c.q, c.k, c.v, c.options);
  const AttentionProblem p = make_problem(c.q, c.k, c.v, c.options, attn.metadata());
  AttentionBuffers got{out.out, out.lse, out.attention_weights, {}, {}};
  EXPECT_TRUE(within_tolerance(p, got)) << name << ": " << out.decision.to_log_line();
  return out;
}

using VulkanDispatch = VulkanTest;

TEST_F(VulkanDispatch, OperatorsRunOnTheGpu) {
  // blocksparse keeps its own kernel only for causal prefill with q_len % 128 == 0.
  const Case causal = make_case(Spec().shape(1, 128, 160).heads(4, 2).dim(64).causal(true), 1);
  for (const char* name : {"vanilla", "blocksparse", "flash_attn2"}) {
    const AttentionOutput out = call_and_check(name, gpu_first(), causal);
    EXPECT_EQ(out.decision.backend, Backend::gpu) << out.decision.to_log_line();
    EXPECT_EQ(out.decision.op, name) << out.decision.to_log_line();
  }
  const Case odd = make_case(Spec().shape(2, 37, 50).heads(2, 1).dim(80).causal(false).sinks(), 2);
  const AttentionOutput out = call_and_check("flash_attn2", gpu_first(), odd);
  EXPECT_EQ(out.decision.backend, Backend::gpu) << out.decision.to_log_line();
}

TEST_F(VulkanDispatch, GpuErrorFallsBackToTheCpu) {
  const Case c = make_case(Spec().shape(1, 128, 128).heads(2, 2).dim(40).causal(true), 3);
  vulkan::debug::set_inject_fault(true);
  std::optional<AttentionOutput> out;
  EXPECT_NO_THROW(out = call_and_check("blocksparse", gpu_first(), c));
  vulkan::debug::set_inject_fault(false);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->decision.backend, Backend::cpu) << out->decision.to_log_line();
  EXPECT_TRUE(out->decision.has(ReasonCode::gpu_error)) << out->decision.to_log_line();
  EXPECT_NE(out->decision.to_log_line().find("VK_ERROR_DEVICE_LOST"), std::string::npos)
      << out->decision.to_log_line();
}

TEST_F(VulkanDispatch, NoQualifyingDeviceRoutesToTheCpu) {
  const char* old = std::getenv("ATTNOPS_VK_ALLOW_SOFTWARE");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  unsetenv("ATTNOPS_VK_ALLOW_SOFTWARE");
  Config cfg = gpu_first();
  cfg.gpu_allow_software = false;
  bool hardware = false;
  for (const GpuDeviceInfo& d : vulkan::list_devices(GpuSettings{}))
    hardware = hardware || (d.qualifies && !d.software);
  const Case c = make_case(Spec().shape(1, 5, 9).dim(16), 4);
  std::optional<AttentionOutput> out;
  if (!hardware) out = call_and_check("vanilla", cfg, c);
  if (saved) setenv("ATTNOPS_VK_ALLOW_SOFTWARE", saved->c_str(), 1);
  if (hardware) GTEST_SKIP() << "a hardware GPU qualifies on this host";
  EXPECT_EQ(out->decision.backend, Backend::cpu) << out->decision.to_log_line();
  EXPECT_TRUE(out->decision.has(ReasonCode::backend_unavailable)) << out->decision.to_log_line();
  EXPECT_NE(out->decision.to_log_line().find("allow_software"), std::string::npos)
      << out->decision.to_log_line();
}

}  // namespace
}  // namespace attnops::testing
