// The amx tier's tiled kernel, compiled a second time from the same sources with the avx2 flags
// and its instructions beyond AVX2 emulated (ATTNOPS_ISA_EMULATE: backends/cpu/amx_tiles.h's tile
// configuration, loads, stores, zero and TDPBF16PS, simd16_bf16.h's bf16 conversions, in C++), on
// bf16 inputs against the fp64 oracle. This proves the AMX path's packing (K rows, V^T, Q^T and
// P^T pairs), strides, edge blocks and loop structure on any AVX2 CPU; the real tiles are tested
// by tests/tiled and TierSupport.amx where the CPU has AMX.
#include <gtest/gtest.h>

#include <string>

#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/tier_kernels.h"
#include "backends/native/reference.h"
#include "tests/support/testing.h"
#include "tests/tiled/tiled_cases.h"

namespace attnops::cpu {
namespace tier_amx_emulated {
const TierKernels& tier_kernels();
}
namespace {

std::vector<tiled_test::KernelCase> bf16_cases() {
  std::vector<tiled_test::KernelCase> v = tiled_test::explicit_cases();
  for (auto& c : tiled_test::random_cases(30, 20261123)) v.push_back(c);
  for (auto& c : v) c.spec.dtype = DType::bf16;
  return v;
}

class AmxEmulated : public ::testing::TestWithParam<tiled_test::KernelCase> {};

TEST_P(AmxEmulated, TiledBf16MatchesOracle) {
  if (detect_isa().best < Isa::avx2)
    GTEST_SKIP() << "the emulated amx tier is built with the avx2 flags, which this CPU lacks ("
                 << detect_isa().refused << ")";
  const tiled_test::KernelCase& kc = GetParam();
  const testing::Case c = testing::make_case(kc.spec, kc.seed);
  const AttentionProblem p = testing::problem_for(c, kc.bq, kc.bk);
  SCOPED_TRACE(c.describe() + " bq=" + std::to_string(kc.bq) + " bk=" + std::to_string(kc.bk));
  const BlockMap map = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k);
  AttentionBuffers got = allocate_buffers(p);
  const TierKernels& k = tier_amx_emulated::tier_kernels();
  ASSERT_EQ(k.isa, Isa::amx);
  ASSERT_TRUE(k.emulated);
  const std::string path = k.tiled(p, map, got);
  EXPECT_NE(path.find("AMX"), std::string::npos) << path;
  EXPECT_TRUE(testing::within_tolerance(p, got));
}

INSTANTIATE_TEST_SUITE_P(Cases, AmxEmulated, ::testing::ValuesIn(bf16_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace attnops::cpu
