// Routing: which operator and which backend forward runs, proven with mock operators (real gates,
// mocked forwards) and a mock host (capabilities set per test). No kernel runs here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "attnops/ext/environment.h"
#include "attnops/ext/problem.h"
#include "operators/blocksparse.h"
#include "operators/flash_attn2.h"
#include "operators/vanilla.h"
#include "tests/routing/mocks.h"
#include "tests/routing/routing_fixture.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using ::testing::_;
using ::testing::HasSubstr;
using ::testing::NiceMock;
using ::testing::Return;
using ::testing::Throw;

TEST_F(Routing, DecodeFallsBackToVanilla) {
  shapes(1, 300);
  auto attn = reg.get("blocksparse");
  expect_only(*bs, std::nullopt);
  expect_only(*van, Backend::cpu);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.requested, "blocksparse");
  EXPECT_EQ(out.decision.op, "vanilla");
  EXPECT_EQ(out.decision.backend, Backend::cpu);
  EXPECT_TRUE(out.decision.has(ReasonCode::decode));
}

TEST_F(Routing, NonCausalFallsBackToVanilla) {
  shapes(256, 256);
  auto attn = reg.get("blocksparse");
  expect_only(*bs, std::nullopt);
  expect_only(*van, Backend::cpu);
  auto out = attn(q, k, v, {.causal = false});
  EXPECT_EQ(out.decision.op, "vanilla");
  ASSERT_FALSE(out.decision.reasons.empty());
  EXPECT_EQ(out.decision.reasons[0].code, ReasonCode::non_causal);
}

TEST_F(Routing, SeqNotMultipleOf128FallsBackToVanilla) {
  shapes(200, 200);
  auto attn = reg.get("blocksparse");
  expect_only(*bs, std::nullopt);
  expect_only(*van, Backend::cpu);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.op, "vanilla");
  ASSERT_EQ(out.decision.reasons.size(), 2u);  // seq_multiple, then gpu unavailable for vanilla
  EXPECT_EQ(out.decision.reasons[0].code, ReasonCode::seq_multiple);
  EXPECT_THAT(out.decision.reasons[0].detail, HasSubstr("200"));
}

TEST_F(Routing, EveryFiringRuleIsRecorded) {
  shapes(1, 64);
  auto out = reg.get("blocksparse")(q, k, v, {.causal = false});
  EXPECT_TRUE(out.decision.has(ReasonCode::decode));
  EXPECT_TRUE(out.decision.has(ReasonCode::non_causal));
  EXPECT_TRUE(out.decision.has(ReasonCode::seq_multiple));
}

TEST_F(Routing, CausalMultipleOf128RunsBlocksparseOnceOnCpu) {
  shapes(256, 384);
  auto attn = reg.get("blocksparse");
  expect_only(*bs, Backend::cpu);
  expect_only(*van, std::nullopt);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.op, "blocksparse");
  EXPECT_EQ(out.decision.backend, Backend::cpu);
  EXPECT_FALSE(out.decision.fell_back());
  // auto tried the GPU first and says why it moved on.
  ASSERT_EQ(out.decision.reasons.size(), 1u);
  EXPECT_EQ(out.decision.reasons[0].code, ReasonCode::backend_unavailable);
  EXPECT_THAT(out.decision.reasons[0].detail, HasSubstr("gpu"));
}

TEST_F(Routing, AutoPrefersARealGpu) {
  gpu_present = true;
  shapes(128, 128);
  auto attn = reg.get("splash");  // alias
  expect_only(*bs, Backend::gpu);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.requested, "blocksparse");
  EXPECT_EQ(out.decision.backend, Backend::gpu);
  EXPECT_TRUE(out.decision.reasons.empty());
}

TEST_F(Routing, YamlBackendOrderIsHonoured) {
  gpu_present = true;
  shapes(128, 128);
  auto attn = reg.get("blocksparse", parse_config("backend: [native, cpu]\n"));
  expect_only(*bs, Backend::native);
  EXPECT_EQ(attn(q, k, v).decision.backend, Backend::native);
}

TEST_F(Routing, OperatorSectionOverridesTopLevelBackend) {
  shapes(128, 128);
  auto cfg = parse_config("backend: native\noperators:\n  blocksparse:\n    backend: cpu\n");
  auto attn = reg.get("blocksparse", cfg);
  expect_only(*bs, Backend::cpu);
  EXPECT_EQ(attn(q, k, v).decision.backend, Backend::cpu);
  // vanilla has no section: the top-level preference applies to it.
  auto vattn = reg.get("vanilla", cfg);
  expect_only(*van, Backend::native);
  EXPECT_EQ(vattn(q, k, v).decision.backend, Backend::native);
}

TEST_F(Routing, GpuAskedButAbsentRunsCpuWithReason) {
  shapes(128, 128);
  auto attn = reg.get("blocksparse", parse_config("backend: gpu\n"));
  expect_only(*bs, Backend::cpu);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::cpu);
  ASSERT_TRUE(out.decision.has(ReasonCode::backend_unavailable));
  EXPECT_THAT(out.decision.reasons[0].detail, HasSubstr("gpu: no Vulkan device"));
}

TEST_F(Routing, TpuIsUnavailable) {
  shapes(128, 128);
  OperationMetadata md = BlockSparseAttn::default_metadata();
  md.backends = {Backend::tpu};
  auto attn = reg.get("blocksparse", md);
  expect_only(*bs, Backend::cpu);
  auto out = attn(q, k, v);
  ASSERT_FALSE(out.decision.reasons.empty());
  EXPECT_EQ(out.decision.reasons[0].code, ReasonCode::backend_unavailable);
  EXPECT_THAT(out.decision.reasons[0].detail, HasSubstr("tpu"));
}

TEST_F(Routing, RealTpuForwardReportsUnavailable) {
  shapes(128, 128);
  BlockSparseAttn op(BlockSparseAttn::default_metadata());
  auto p = make_problem(q, k, v, {}, op.metadata());
  try {
    op.forward(Backend::tpu, p);
    FAIL() << "forward_tpu returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::backend_unavailable);
    EXPECT_THAT(e.what(), HasSubstr("TPU"));
  }
  EXPECT_FALSE(system_host()->availability(Backend::tpu, {}).available);
}

TEST_F(Routing, FallbacksSwitchedOffInYamlStayOff) {
  shapes(1, 300);
  auto cfg = parse_config(
      "operators:\n  blocksparse:\n    fallbacks: {decode: false, non_causal: false, seq_multiple: false}\n");
  auto attn = reg.get("blocksparse", cfg);
  expect_only(*bs, Backend::cpu);
  expect_only(*van, std::nullopt);
  auto out = attn(q, k, v, {.causal = false});
  EXPECT_EQ(out.decision.op, "blocksparse");
  EXPECT_FALSE(out.decision.has(ReasonCode::decode));
  EXPECT_FALSE(out.decision.has(ReasonCode::non_causal));
}

TEST_F(Routing, OnlyTheRuleSwitchedOffIsOff) {
  // decode off, seq_multiple still on: q_len 1 is not a multiple of 128, so that rule fires.
  shapes(1, 300);
  auto attn =
      reg.get("blocksparse", parse_config("operators:\n  blocksparse:\n    fallbacks: {decode: false}\n"));
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.op, "vanilla");
  EXPECT_FALSE(out.decision.has(ReasonCode::decode));
  EXPECT_TRUE(out.decision.has(ReasonCode::seq_multiple));
}

TEST_F(Routing, FlashFallsBackOnlyOnDecode) {
  shapes(1, 77);
  {
    auto attn = reg.get("flash");
    expect_only(*fl, std::nullopt);
    expect_only(*van, Backend::cpu);
    auto out = attn(q, k, v);
    EXPECT_EQ(out.decision.op, "vanilla");
    EXPECT_TRUE(out.decision.has(ReasonCode::decode));
  }
  shapes(77, 77);  // not causal, not a multiple of 128: flash keeps it
  auto attn = reg.get("flash_attn2");
  expect_only(*fl, Backend::cpu);
  auto out = attn(q, k, v, {.causal = false});
  EXPECT_EQ(out.decision.op, "flash_attn2");
}

TEST_F(Routing, ForceNativeEnv) {
  gpu_present = true;
  setenv("ATTNOPS_FORCE_NATIVE", "1", 1);
  attnops::reload_environment();
  shapes(128, 128);
  auto attn = reg.get("blocksparse");
  expect_only(*bs, Backend::native);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::native);
  EXPECT_TRUE(out.decision.has(ReasonCode::forced_native));
}

// The environment is read once per process (attnops/environment.h), not per call: a variable set
// after the first call takes effect at reload_environment(), not before.
TEST_F(Routing, EnvironmentIsReadOnceUntilReloaded) {
  gpu_present = true;
  shapes(128, 128);
  auto attn = reg.get("blocksparse");
  EXPECT_NE(attn(q, k, v).decision.backend, Backend::native);
  const std::uint64_t g = attnops::environment_generation();
  setenv("ATTNOPS_FORCE_NATIVE", "1", 1);
  EXPECT_NE(attn(q, k, v).decision.backend, Backend::native);  // not read again
  EXPECT_EQ(attnops::environment_generation(), g);
  attnops::reload_environment();
  EXPECT_GT(attnops::environment_generation(), g);
  EXPECT_EQ(attn(q, k, v).decision.backend, Backend::native);
  setenv("ATTNOPS_FORCE_NATIVE", "maybe", 1);  // an invalid value: every call is a typed error
  attnops::reload_environment();
  try {
    attn(q, k, v);
    ADD_FAILURE() << "an invalid ATTNOPS_FORCE_NATIVE ran the call";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("ATTNOPS_FORCE_NATIVE='maybe'"));
  }
}

TEST_F(Routing, ForceNativeStillAppliesOperatorFallbacks) {
  setenv("ATTNOPS_FORCE_NATIVE", "1", 1);
  attnops::reload_environment();
  shapes(1, 128);
  auto attn = reg.get("blocksparse");
  expect_only(*van, Backend::native);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.op, "vanilla");
  EXPECT_EQ(out.decision.backend, Backend::native);
}

TEST_F(Routing, DisabledBackendIsSkippedWithReason) {
  gpu_present = true;
  shapes(128, 128);
  auto attn = reg.get("blocksparse", parse_config("disabled_backends: [gpu]\n"));
  expect_only(*bs, Backend::cpu);
  auto out = attn(q, k, v);
  ASSERT_FALSE(out.decision.reasons.empty());
  EXPECT_EQ(out.decision.reasons[0].code, ReasonCode::disabled_by_config);
}

TEST_F(Routing, GpuRuntimeErrorFallsBackToCpu) {
  gpu_present = true;
  shapes(128, 128);
  auto attn = reg.get("blocksparse");
  EXPECT_CALL(*bs, forward_gpu(_)).WillOnce(Throw(Error(ErrorCode::gpu_error, "VK_ERROR_DEVICE_LOST")));
  EXPECT_CALL(*bs, forward_cpu(_)).Times(1);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::cpu);
  ASSERT_TRUE(out.decision.has(ReasonCode::gpu_error));
  EXPECT_THAT(out.decision.reasons[0].detail, HasSubstr("DEVICE_LOST"));
}

TEST_F(Routing, WhatTheBackendReportsAboutTheRunIsKept) {
  shapes(128, 128);
  auto attn = reg.get("blocksparse");
  AttentionOutput reported;
  reported.decision.run.kernel = "avx512";
  reported.decision.run.kernel_detail = "detected avx512bf16, capped by ATTNOPS_CPU_ISA";
  reported.decision.backend = Backend::tpu;  // the dispatcher's own fields win
  EXPECT_CALL(*bs, forward_cpu(_)).WillOnce(Return(reported));
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::cpu);
  EXPECT_EQ(out.decision.run, reported.decision.run);
  EXPECT_THAT(out.decision.to_json(), HasSubstr("\"kernel\": \"avx512\""));
  EXPECT_THAT(out.decision.to_log_line(), HasSubstr(",cpu/avx512,"));
}

// Auto's cost rule (cost.h): with rates, the gpu runs only when its estimate beats the cpu's.
TEST_F(Routing, CostRuleSendsSmallCallsToTheCpuWithTheEstimate) {
  gpu_present = true;
  shapes(128, 128);
  Config cfg;
  cfg.gpu_cost_rates = CostRates{100, 1000, 10, 10, 50};  // cpu 100 GFLOP/s, gpu 1000, 50 us per call
  auto attn = reg.get("flash_attn2", cfg);
  // 128 x 128 causal, 4 heads, D 16: ~0.55 MFLOP: cpu ~5.5 us, gpu >= 50 us.
  expect_only(*fl, Backend::cpu);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::cpu);
  ASSERT_TRUE(out.decision.has(ReasonCode::cpu_faster)) << out.decision.to_log_line();
  ASSERT_TRUE(out.decision.cost.has_value());
  EXPECT_LT(out.decision.cost->cpu_us, out.decision.cost->gpu_us);
  EXPECT_DOUBLE_EQ(out.decision.cost->call_us, 50);
  EXPECT_EQ(out.decision.cost->rates_source, "config");
  EXPECT_THAT(out.decision.to_json(), HasSubstr("\"cost\": {\"gpu_us\": "));
  EXPECT_THAT(out.decision.to_log_line(), HasSubstr("cpu_faster:gpu: estimated"));
  // plan() decides the same way, deterministically.
  EXPECT_EQ(attn.explain(q, k, v).reasons, out.decision.reasons);
}

TEST_F(Routing, CostRuleKeepsLargeCallsOnTheGpu) {
  gpu_present = true;
  shapes(4096, 4096);
  Config cfg;
  cfg.gpu_cost_rates = CostRates{100, 10000, 10, 10, 50};
  auto attn = reg.get("flash_attn2", cfg);
  expect_only(*fl, Backend::gpu);
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::gpu);
  EXPECT_FALSE(out.decision.has(ReasonCode::cpu_faster));
  ASSERT_TRUE(out.decision.cost.has_value());
  EXPECT_LT(out.decision.cost->gpu_us, out.decision.cost->cpu_us);
}

TEST_F(Routing, CostRuleUsesTheHostsRatesAndOnlyForAuto) {
  gpu_present = true;
  shapes(128, 128);
  EXPECT_CALL(*host, cost_rates(_))
      .WillRepeatedly(
          Return(MockHost::Rates{std::pair{CostRates{100, 1, 1, 1, 1000}, std::string("measured")}}));
  auto out = reg.get("flash_attn2")(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::cpu);
  ASSERT_TRUE(out.decision.cost.has_value());
  EXPECT_EQ(out.decision.cost->rates_source, "measured");
  // A gpu the config names is tried as named: no estimate.
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  out = reg.get("flash_attn2", cfg)(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::gpu);
  EXPECT_FALSE(out.decision.cost.has_value());
}

TEST_F(Routing, WithoutRatesAutoStillPrefersTheGpu) {
  gpu_present = true;
  shapes(128, 128);
  auto out = reg.get("flash_attn2")(q, k, v);  // the mock host has no rates
  EXPECT_EQ(out.decision.backend, Backend::gpu);
  EXPECT_FALSE(out.decision.cost.has_value());
}

TEST(CostRates, FormatAndParseRoundTrip) {
  const CostRates r{12.5, 3000, 8, 9.5, 40};
  EXPECT_EQ(parse_rates(format_rates(r)), r);
  EXPECT_FALSE(parse_rates("cpu_gflops=1 bogus=2").valid());
  EXPECT_FALSE(parse_rates("cpu_gflops=x").valid());
  const CostEstimate e = estimate_cost(r, 1e9, 8e6, 9.5e6);
  EXPECT_NEAR(e.upload_us, 1000, 1e-9);
  EXPECT_NEAR(e.download_us, 1000, 1e-9);
  EXPECT_NEAR(e.kernel_us, 1e9 / 3000e3, 1e-9);
  EXPECT_NEAR(e.cpu_us, 1e9 / 12.5e3, 1e-9);
  EXPECT_NEAR(e.gpu_us, 40 + 2000 + 1e9 / 3000e3, 1e-9);
}

TEST(CostRates, ReadFromYaml) {
  const Config c = parse_config(
      "gpu:\n  cost_rates: {cpu_gflops: 50, gpu_gflops: 400, upload_gbps: 12, download_gbps: 11, call_us: "
      "30}\n");
  ASSERT_TRUE(c.gpu_cost_rates.has_value());
  EXPECT_EQ(*c.gpu_cost_rates, (CostRates{50, 400, 12, 11, 30}));
  const OperationMetadata md = c.metadata_for("flash_attn2", {}, OperationMetadata{});
  EXPECT_EQ(md.gpu.cost_rates, c.gpu_cost_rates);
  try {
    parse_config("gpu:\n  cost_rates: {cpu_gflops: 50}\n");
    ADD_FAILURE() << "incomplete rates accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    EXPECT_THAT(e.what(), HasSubstr("gpu.cost_rates"));
  }
  try {
    parse_config("gpu:\n  cost_rates: {cpu_gflop: 50}\n");
    ADD_FAILURE() << "misspelt key accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cpu_gflops"));
  }
}

TEST_F(Routing, OtherErrorsFromAForwardPropagate) {
  shapes(128, 128);
  auto attn = reg.get("blocksparse");
  EXPECT_CALL(*bs, forward_cpu(_)).WillOnce(Throw(Error(ErrorCode::internal, "boom")));
  EXPECT_CALL(*bs, forward_native(_)).Times(0);
  EXPECT_THROW(attn(q, k, v), Error);
}

TEST_F(Routing, UnsupportedInputsMoveToTheNextBackend) {
  gpu_present = true;
  shapes(128, 128);
  auto attn = reg.get("blocksparse");
  ON_CALL(*bs, check_inputs(Backend::gpu, _))
      .WillByDefault(Return(Reason{ReasonCode::unsupported_feature, "head_dim 16 too small (mock)"}));
  expect_only(*bs, Backend::cpu);
  auto out = attn(q, k, v);
  ASSERT_FALSE(out.decision.reasons.empty());
  EXPECT_EQ(out.decision.reasons[0].code, ReasonCode::unsupported_feature);
  EXPECT_THAT(out.decision.reasons[0].detail, HasSubstr("gpu:"));
}

// An operator with only a native forward: the cpu candidate reports not_implemented.
class NativeOnly : public VanillaAttn {
 public:
  using VanillaAttn::VanillaAttn;
  std::string name() const override { return "native_only"; }
  bool implements(Backend b) const override { return b == Backend::native; }
  MOCK_METHOD(AttentionOutput, forward_native, (const AttentionProblem&), (override));
};

TEST_F(Routing, NotImplementedBackendIsSkipped) {
  NativeOnly* op = nullptr;
  reg.add({"native_only", {}, OperationMetadata{}, [&](const OperationMetadata& md) {
             auto p = std::make_shared<NativeOnly>(md);
             op = p.get();
             return p;
           }});
  shapes(4, 4);
  auto attn = reg.get("native_only");
  EXPECT_CALL(*op, forward_native(_)).WillOnce(Return(AttentionOutput{}));
  auto out = attn(q, k, v);
  EXPECT_EQ(out.decision.backend, Backend::native);
  EXPECT_TRUE(out.decision.has(ReasonCode::not_implemented));
}

TEST_F(Routing, NoBackendLeftIsATypedErrorListingEveryReason) {
  shapes(128, 128);
  auto attn = reg.get("blocksparse", parse_config("disabled_backends: [cpu, native]\n"));
  expect_only(*bs, std::nullopt);
  try {
    attn(q, k, v);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::backend_unavailable);
    EXPECT_THAT(e.what(), HasSubstr("gpu"));
    EXPECT_THAT(e.what(), HasSubstr("disabled_by_config"));
  }
}

TEST_F(Routing, PlanDecidesWithoutRunning) {
  shapes(1, 128);
  auto attn = reg.get("blocksparse");
  expect_only(*bs, std::nullopt);
  expect_only(*van, std::nullopt);
  auto d = attn.explain(q, k, v);
  EXPECT_EQ(d.op, "vanilla");
  EXPECT_EQ(d.backend, Backend::cpu);
}

TEST_F(Routing, DispatchLogPrintsOneLinePerCall) {
  setenv("ATTNOPS_LOG", "dispatch", 1);
  attnops::reload_environment();
  shapes(1, 128);
  auto attn = reg.get("blocksparse");
  ::testing::internal::CaptureStderr();
  attn(q, k, v);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(
      err,
      "attnops,dispatch,blocksparse->vanilla,cpu,decode:q_len=1;seq_multiple:q_len=1 is not a multiple of "
      "128;backend_unavailable:gpu: no Vulkan device (mock)\n");
  unsetenv("ATTNOPS_LOG");
  attnops::reload_environment();
  ::testing::internal::CaptureStderr();
  attn(q, k, v);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST_F(Routing, DecisionJsonIsStable) {
  shapes(1, 128);
  auto d = reg.get("blocksparse").explain(q, k, v);
  EXPECT_EQ(
      d.to_json(),
      "{\"requested\": \"blocksparse\", \"operator\": \"vanilla\", \"backend\": \"cpu\", \"reasons\": "
      "[{\"code\": \"decode\", \"detail\": \"q_len=1\"}, {\"code\": \"seq_multiple\", \"detail\": \"q_len=1 "
      "is "
      "not a multiple of 128\"}, {\"code\": \"backend_unavailable\", \"detail\": \"gpu: no Vulkan device "
      "(mock)\"}]}");
}

TEST_F(Routing, UnknownNameListsRegisteredNamesAndSuggests) {
  try {
    reg.get("blocksparce");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unknown_operator);
    EXPECT_THAT(e.what(), HasSubstr("blocksparse (alias splash), flash_attn2 (alias flash), vanilla"));
    EXPECT_THAT(e.what(), HasSubstr("did you mean 'blocksparse'"));
  }
  EXPECT_EQ(reg.list(), (std::vector<std::string>{"blocksparse", "flash_attn2", "vanilla"}));
  EXPECT_EQ(reg.canonical("flash"), "flash_attn2");
}

// A name from a file or a user reaches the message with its control bytes escaped (an ESC
// sequence cannot drive the terminal that shows the error).
TEST_F(Routing, UnknownNameIsEscapedInTheMessage) {
  try {
    reg.get("flash\x1b[31m\n");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unknown_operator);
    EXPECT_THAT(e.what(), HasSubstr("unknown operator 'flash\\x1b[31m\\x0a'"));
    EXPECT_EQ(std::string(e.what()).find('\x1b'), std::string::npos);
  }
}

TEST_F(Routing, AliasCollisionIsRejected) {
  EXPECT_THROW(reg.add({"other",
                        {"splash"},
                        OperationMetadata{},
                        [](const OperationMetadata& md) { return std::make_shared<VanillaAttn>(md); }}),
               Error);
}

TEST_F(Routing, ConfigNamingAnUnknownOperatorIsAnError) {
  auto cfg = parse_config("backend: cpu\noperators:\n  blocksparce:\n    backend: cpu\n", "my.yaml");
  try {
    reg.get("blocksparse", cfg);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    EXPECT_THAT(e.what(), HasSubstr("my.yaml:3:3"));
    EXPECT_THAT(e.what(), HasSubstr("did you mean 'blocksparse'"));
  }
}

TEST_F(Routing, WeightsOnlyFromVanilla) {
  shapes(128, 128);
  EXPECT_THROW(reg.get("blocksparse")(q, k, v, {.return_weights = true}), Error);
  shapes(1, 128);  // decode: blocksparse hands the call to vanilla, which can return weights
  EXPECT_NO_THROW(reg.get("blocksparse")(q, k, v, {.return_weights = true}));
}

TEST_F(Routing, ConcurrentCallsShareOneHandle) {
  shapes(128, 128);
  auto attn = reg.get("blocksparse");
  EXPECT_CALL(*bs, forward_cpu(_)).Times(8);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 2; ++i) EXPECT_EQ(attn(q, k, v).decision.op, "blocksparse");
      EXPECT_EQ(reg.list().size(), 3u);
    });
  for (auto& t : ts) t.join();
}

TEST(RoutingDefaults, BuiltinRegistryHasTheFourOperators) {
  EXPECT_EQ(registry().list(),
            (std::vector<std::string>{"blocksparse", "flash_attn2", "ragged_paged", "vanilla"}));
  EXPECT_EQ(registry().canonical("paged"), "ragged_paged");
  EXPECT_EQ(registry().entry("ragged_paged").defaults.fallbacks, FallbackPolicy{});
  EXPECT_EQ(registry().canonical("splash"), "blocksparse");
  const FallbackPolicy bs = registry().entry("blocksparse").defaults.fallbacks;
  EXPECT_TRUE(bs.decode && bs.non_causal && bs.seq_multiple);
  const FallbackPolicy fl = registry().entry("flash_attn2").defaults.fallbacks;
  EXPECT_TRUE(fl.decode);
  EXPECT_FALSE(fl.non_causal || fl.seq_multiple);
  EXPECT_EQ(registry().entry("vanilla").defaults.fallbacks, FallbackPolicy{});
}

}  // namespace
}  // namespace attnops::testing
