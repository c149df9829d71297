// How the CPU tiled kernel steps through a q block's row of kv blocks: the AMX path takes runs of
// consecutive full blocks together (up to 512 keys, tiled_common.h span_keys) and skips O^T's
// rescale when no row's max changed. Checked on every kernel tier (the emulated ones included)
// against the native tiled kernel on the same block map, for maps whose rows have gaps between
// full blocks (a hand-thinned map: no mask makes such rows, but the kernel must follow the map),
// and against the oracle on rows of several 512-key steps with peaked scores (the running max
// changes between steps) in every dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/tiled_cpu.h"
#include "backends/native/tiled_native.h"
#include "tests/support/testing.h"

namespace attnops {
namespace {

// The map with the blocks `keep(qb, kv)` refuses removed from every row.
template <class Keep>
BlockMap thinned(const BlockMap& full, Keep keep) {
  BlockMap m = full;
  m.blocks.clear();
  m.row_start.assign(1, 0);
  for (std::int64_t hh = 0; hh < full.heads; ++hh)
    for (std::int64_t qb = 0; qb < full.nq; ++qb) {
      for (const BlockMap::Block& b : full.row(hh, qb))
        if (keep(qb, b.kv)) m.blocks.push_back(b);
      m.row_start.push_back(static_cast<std::int64_t>(m.blocks.size()));
    }
  return m;
}

double max_diff(const AttentionBuffers& a, const AttentionBuffers& b) {
  double worst = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(a.out.numel()); ++i) {
    const double d = std::abs(static_cast<double>(a.out.at(i)) - b.out.at(i));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

TEST(TiledSteps, RowsWithGapsBetweenFullBlocksMatchNativeKernel) {
  for (const DType dt : {DType::bf16, DType::f32, DType::f16}) {
    testing::CaseSpec spec;
    spec.Tq = 70, spec.Tk = 700, spec.Hq = 2, spec.Hkv = 1, spec.D = 40, spec.causal = false;
    spec.dtype = dt;
    spec.scale_inputs = 3.f;
    const testing::Case c = testing::make_case(spec, 17);
    const AttentionProblem p = testing::problem_for(c, 32, 32);
    const BlockMap full = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, 32, 32);
    // Runs of 1..4 blocks with gaps of 1..3, shifted per q block; some rows keep everything.
    const BlockMap map = thinned(full, [](std::int64_t qb, std::int64_t kv) {
      return qb == 1 || (kv + qb) % 7 < 4 || (kv * 5 + qb) % 11 == 0;
    });
    AttentionBuffers want = allocate_buffers(p);
    native::tiled_attention(p, map, want);
    for (const cpu::ForcedTier& tier : testing::cpu_kernel_tiers_to_test()) {
      AttentionBuffers got = allocate_buffers(p);
      cpu::tiled_attention(p, map, got, tier);
      EXPECT_LE(max_diff(want, got), testing::tolerance_for(dt).out)
          << dtype_name(dt) << " " << testing::tier_label(tier);
    }
  }
}

TEST(TiledSteps, LongRowsWithPeakedScoresMatchOracle) {
  for (const DType dt : {DType::bf16, DType::f32, DType::f16})
    for (const bool causal : {false, true}) {
      testing::CaseSpec spec;
      spec.Tq = causal ? 1100 : 40, spec.Tk = 1100, spec.Hq = 2, spec.Hkv = 2, spec.D = 24;
      spec.causal = causal;
      spec.dtype = dt;
      spec.scale_inputs = 6.f;  // peaked rows: maxima found late move the running max
      const testing::Case c = testing::make_case(spec, 29);
      const AttentionProblem p = testing::problem_for(c, 64, 64);
      const BlockMap map = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, 64, 64);
      const native::ReferenceResult ref = native::reference_attention_f64(p, false);
      for (const cpu::ForcedTier& tier : testing::cpu_kernel_tiers_to_test()) {
        AttentionBuffers got = allocate_buffers(p);
        cpu::tiled_attention(p, map, got, tier);
        EXPECT_TRUE(testing::within_tolerance(p, ref, got))
            << dtype_name(dt) << (causal ? " causal " : " ") << testing::tier_label(tier);
      }
    }
}

}  // namespace
}  // namespace attnops
