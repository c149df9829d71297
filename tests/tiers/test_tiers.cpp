// The CPU tier choice (backends/cpu/isa.h) and each tier through the public API:
//  - the decision from CPU features (CPUID bits, XCR0, the AMX permission), every refusal;
//  - the ATTNOPS_CPU_ISA cap: lowers the tier, never raises it, a typo is ignored and reported;
//  - TierSupport/<tier>: flash_attn2 and vanilla through registry().get(...) under the cap, the
//    decision naming the tier that ran, results within tolerance; a tier this machine does not
//    run is skipped with the reason (e.g. "amx refused: CPU lacks AMX-TILE/AMX-BF16").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "attnops/ext/problem.h"
#include "backends/cpu/isa.h"
#include "tests/support/testing.h"

namespace attnops::cpu {
namespace {

using ::testing::HasSubstr;

// Sets ATTNOPS_CPU_ISA for the scope, restoring the previous value.
class ScopedCap {
 public:
  explicit ScopedCap(const char* value) {
    if (const char* v = std::getenv(kIsaCapEnv)) saved_ = v;
    if (value)
      setenv(kIsaCapEnv, value, 1);
    else
      unsetenv(kIsaCapEnv);
    attnops::reload_environment();  // the library reads its environment once (attnops/environment.h)
  }
  ~ScopedCap() {
    if (saved_)
      setenv(kIsaCapEnv, saved_->c_str(), 1);
    else
      unsetenv(kIsaCapEnv);
    attnops::reload_environment();
  }
  ScopedCap(const ScopedCap&) = delete;
  ScopedCap& operator=(const ScopedCap&) = delete;

 private:
  std::optional<std::string> saved_;
};

// A CPU with everything up to AMX, its state enabled and the permission granted.
CpuFeatures full_features() {
  CpuFeatures f;
  f.x86 = f.osxsave = f.avx = f.avx2 = f.fma = f.f16c = true;
  f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = f.avx512bf16 = true;
  f.amx_tile = f.amx_bf16 = true;
  f.xcr0 = 0x6 | 0xE0 | (std::uint64_t{3} << 17);
  f.amx_permission_errno = 0;
  return f;
}

TEST(IsaDecision, EveryMissingPieceLowersTheTierAndSaysWhy) {
  struct Step {
    const char* what;
    void (*remove)(CpuFeatures&);
    Isa best;
    const char* reason;
  };
  const Step steps[] = {
      {"nothing missing", [](CpuFeatures&) {}, Isa::amx, ""},
      {"permission", [](CpuFeatures& f) { f.amx_permission_errno = 1; }, Isa::avx512bf16,
       "amx refused: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed"},
      {"tile state", [](CpuFeatures& f) { f.xcr0 &= ~(std::uint64_t{1} << 18); }, Isa::avx512bf16,
       "amx refused: the OS does not enable tile state"},
      {"amx-bf16", [](CpuFeatures& f) { f.amx_bf16 = false; }, Isa::avx512bf16, "CPU lacks AMX-BF16"},
      {"avx512bf16", [](CpuFeatures& f) { f.avx512bf16 = false; }, Isa::avx512,
       "avx512bf16 refused: CPU lacks AVX512_BF16"},
      {"zmm state", [](CpuFeatures& f) { f.xcr0 &= ~std::uint64_t{0x80}; }, Isa::avx2,
       "avx512 refused: the OS does not enable opmask/ZMM state"},
      {"avx512bw", [](CpuFeatures& f) { f.avx512bw = false; }, Isa::avx2,
       "avx512 refused: CPU lacks AVX512BW"},
      {"f16c", [](CpuFeatures& f) { f.f16c = false; }, Isa::baseline, "avx2 refused: CPU lacks F16C"},
      {"ymm state", [](CpuFeatures& f) { f.xcr0 &= ~std::uint64_t{0x4}; }, Isa::baseline,
       "avx2 refused: the OS does not enable AVX state"},
      {"not x86", [](CpuFeatures& f) { f.x86 = false; }, Isa::baseline, "only the baseline tier"},
  };
  for (const Step& s : steps) {
    CpuFeatures f = full_features();
    s.remove(f);
    const IsaDetection d = decide_isa(f);
    EXPECT_EQ(d.best, s.best) << s.what;
    EXPECT_THAT(d.refused, HasSubstr(s.reason)) << s.what;
  }
  EXPECT_EQ(decide_isa(full_features()).cpu.summary(),
            "avx2 fma f16c avx512f avx512bw avx512dq avx512vl avx512bf16 amx-tile amx-bf16");
}

TEST(IsaNames, RoundTripAndRejectOthers) {
  for (int i = 0; i < kIsaCount; ++i)
    EXPECT_EQ(parse_isa(isa_name(static_cast<Isa>(i))), static_cast<Isa>(i));
  EXPECT_FALSE(parse_isa("AVX2"));
  EXPECT_FALSE(parse_isa("avx512_bf16"));
  EXPECT_EQ(isa_names(), "baseline|avx2|avx512|avx512bf16|amx");
}

TEST(IsaCap, LowersNeverRaisesAndATypoIsIgnoredVisibly) {
  const Isa detected = detect_isa().best;
  {
    ScopedCap cap("baseline");
    const IsaChoice c = choose_isa();
    EXPECT_EQ(c.tier, Isa::baseline);
    EXPECT_EQ(c.detected, detected);
    if (detected != Isa::baseline) {
      EXPECT_THAT(c.detail, HasSubstr("capped by ATTNOPS_CPU_ISA=baseline"));
    }
  }
  {
    ScopedCap cap("amx");  // at or above what is detected: no effect
    EXPECT_EQ(choose_isa().tier, detected);
  }
  {
    ScopedCap cap("avx9000");
    const IsaChoice c = choose_isa();
    EXPECT_EQ(c.tier, detected);
    EXPECT_THAT(c.detail, HasSubstr("ATTNOPS_CPU_ISA=avx9000 ignored: expected one of baseline|avx2"));
  }
  {
    ScopedCap cap(nullptr);
    EXPECT_EQ(choose_isa().tier, detected);
    EXPECT_THAT(choose_isa().detail, HasSubstr("detected " + std::string(isa_name(detected))));
  }
}

class TierSupport : public ::testing::TestWithParam<Isa> {};

// The tier through the public API, selected by the cap as a user would.
TEST_P(TierSupport, RunsThroughTheCapAndTheDecisionNamesIt) {
  const Isa tier = GetParam();
  const IsaChoice now = choose_isa();
  if (tier > now.tier) {
    if (tier > now.detected)
      GTEST_SKIP() << isa_name(tier) << " not tested: this CPU/OS/build runs at most "
                   << isa_name(now.detected) << " (" << detect_isa().refused << ")";
    GTEST_SKIP() << isa_name(tier) << " not tested: " << now.detail;
  }
  ScopedCap cap(std::string(isa_name(tier)).c_str());
  for (const DType dt : {DType::f32, DType::bf16}) {
    testing::CaseSpec s;
    s.B = 1, s.Tq = 200, s.Tk = 200, s.Hq = 4, s.Hkv = 2, s.D = 72, s.dtype = dt;
    const testing::Case c = testing::make_case(s, 5);
    for (const char* op : {"flash_attn2", "vanilla"}) {
      OperationMetadata md = registry().entry(op).defaults;
      md.backends = {Backend::cpu};
      md.fallbacks = FallbackPolicy{};
      const AttentionOutput out = registry().get(op, md)(c.q, c.k, c.v, c.options);
      SCOPED_TRACE(std::string(op) + " " + std::string(dtype_name(dt)));
      EXPECT_EQ(out.decision.backend, Backend::cpu);
      EXPECT_EQ(out.decision.run.kernel, isa_name(tier)) << out.decision.run.kernel_detail;
      EXPECT_THAT(out.decision.to_json(), HasSubstr("\"kernel\": \"" + std::string(isa_name(tier)) + "\""));
      if (tier < now.detected) {
        EXPECT_THAT(out.decision.run.kernel_detail, HasSubstr("capped by ATTNOPS_CPU_ISA"));
      }
      if (op == std::string("flash_attn2") && dt == DType::bf16 && tier >= Isa::avx512bf16) {
        EXPECT_THAT(out.decision.run.kernel_detail, HasSubstr(tier == Isa::amx ? "AMX" : "VDPBF16PS"));
      }
      AttentionBuffers got;
      got.out = out.out;
      EXPECT_TRUE(testing::within_tolerance(testing::problem_for(c), got));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, TierSupport,
                         ::testing::Values(Isa::baseline, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(isa_name(info.param));
                         });

}  // namespace
}  // namespace attnops::cpu
