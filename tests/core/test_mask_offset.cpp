// Mask::at_offset: a block of a larger problem evaluated on the larger problem's positions.
// Semantics against the outer mask, row_interval against visible(), and the kernels of every
// operator on native, cpu and gpu (lavapipe) against the fp64 oracle, forward and backward, with
// each mask kind moved to an offset: what sequence-parallel attention (distributed/) relies on.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"
#include "backends/vulkan/vulkan_backend.h"
#include "tests/backward/grad_testing.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

struct Block {
  std::int64_t q0, tq, k0, tk;
};

std::vector<Mask> outer_masks() {
  return {Mask::full(),
          Mask::causal(),
          Mask::local(3, 2),
          Mask::causal() & Mask::local(5, 0),
          Mask::chunked_causal(6),
          Mask::causal() & Mask::chunked_causal(4) & Mask::local(2, 0),
          Mask::local(1, 0) | Mask::chunked_causal(9),  // rows with a gap: not intervals
          Mask::per_head({Mask::causal(), Mask::local(2, 3), Mask::chunked_causal(5)})};
}

TEST(MaskOffset, EqualsTheOuterMaskOnGlobalPositions) {
  const std::int64_t Tq = 23, Tk = 31, H = 3;
  const std::vector<Block> blocks = {{0, 23, 0, 31},
                                     {5, 7, 9, 11},
                                     {0, 4, 20, 11},
                                     {18, 5, 0, 6},
                                     {20, 6, 25, 10} /* past the outer edges */,
                                     {3, 0, 4, 5},
                                     {3, 5, 4, 0}};
  for (const Mask& m : outer_masks())
    for (const Block& b : blocks) {
      const Mask o = m.at_offset(b.q0, b.k0, Tq, Tk);
      EXPECT_EQ(o.kind(), Mask::Kind::offset);
      EXPECT_EQ(o.head_dependent(), m.head_dependent());
      EXPECT_EQ(o.num_heads(), m.num_heads());
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < b.tq; ++i) {
          const auto iv = o.row_interval(h, i, b.tq, b.tk);
          for (std::int64_t j = 0; j < b.tk; ++j) {
            const std::int64_t gi = b.q0 + i, gj = b.k0 + j;
            const bool want = gi < Tq && gj < Tk && m.visible(h, gi, gj, Tq, Tk);
            ASSERT_EQ(o.visible(h, i, j, b.tq, b.tk), want)
                << o.key() << " h=" << h << " i=" << i << " j=" << j;
            if (iv) {
              ASSERT_EQ(want, j >= iv->first && j < iv->second) << o.key() << " row " << i;
            }
          }
        }
    }
}

TEST(MaskOffset, IntervalsWheneverTheOuterMaskHasThem) {
  for (const Mask& m :
       {Mask::causal(), Mask::local(4, 1), Mask::chunked_causal(7), Mask::causal() & Mask::local(3, 0)})
    for (std::int64_t i = 0; i < 9; ++i)
      EXPECT_TRUE(m.at_offset(11, 2, 40, 40).row_interval(0, i, 9, 30).has_value());
  // A diagonal block of a causal problem is causal; a block below the diagonal is full.
  const Mask diag = Mask::causal().at_offset(16, 16, 64, 64), below = Mask::causal().at_offset(32, 0, 64, 64);
  for (std::int64_t i = 0; i < 16; ++i)
    for (std::int64_t j = 0; j < 16; ++j) {
      EXPECT_EQ(diag.visible(0, i, j, 16, 16), Mask::causal().visible(0, i, j, 16, 16));
      EXPECT_TRUE(below.visible(0, i, j, 16, 16));
    }
  // A sliding window seen from a key block left of the rows: only its last keys are visible.
  const auto iv = Mask::local(3, 0).at_offset(20, 10, 40, 40).row_interval(0, 0, 8, 10);
  ASSERT_TRUE(iv.has_value());
  EXPECT_EQ(*iv, (std::pair<std::int64_t, std::int64_t>{7, 10}));
}

TEST(MaskOffset, KeysAndErrors) {
  const Mask a = Mask::causal().at_offset(1, 2, 10, 10), b = Mask::causal().at_offset(2, 1, 10, 10);
  EXPECT_NE(a.key(), b.key());
  EXPECT_NE(a.key(), Mask::causal().at_offset(1, 2, 10, 11).key());
  EXPECT_EQ(a.key(), Mask::causal().at_offset(1, 2, 10, 10).key());
  EXPECT_EQ(a.q_offset(), 1);
  EXPECT_EQ(a.k_offset(), 2);
  EXPECT_EQ(a.outer_tq(), 10);
  EXPECT_EQ(a.outer_tk(), 10);
  ASSERT_EQ(a.children().size(), 1u);
  EXPECT_EQ(a.children()[0].key(), "causal");
  EXPECT_THROW((void)Mask::causal().at_offset(-1, 0, 4, 4), Error);
  EXPECT_THROW((void)Mask::causal().at_offset(0, -1, 4, 4), Error);
  EXPECT_THROW((void)Mask::causal().at_offset(0, 0, -4, 4), Error);
  // Combined with other masks like any mask.
  const Mask c = a & Mask::local(1, 1);
  EXPECT_EQ(c.kind(), Mask::Kind::all_of);
  EXPECT_FALSE(c.visible(0, 0, 3, 4, 4));  // outside the local window
}

// ---- kernels ------------------------------------------------------------------------------

// One block call of a global case: the block's rows and keys, the global static mask moved to
// the block, segment ids sliced; soft cap and sinks as in the case.
struct BlockCall {
  TensorView q, k, v;
  AttentionOptions options;
};

BlockCall block_call(const Case& c, const Block& b) {
  const AttentionProblem global = problem_for(c);
  BlockCall r;
  r.q = c.q.view().slice(1, b.q0, b.q0 + b.tq);
  r.k = c.k.view().slice(1, b.k0, b.k0 + b.tk);
  r.v = c.v.view().slice(1, b.k0, b.k0 + b.tk);
  r.options.causal = false;
  r.options.mask = global.mask.at_offset(b.q0, b.k0, c.Tq, c.Tk);
  r.options.logits_soft_cap = c.options.logits_soft_cap;
  r.options.sinks = c.options.sinks;
  if (c.seg_q) {
    r.options.segment_ids_q = c.seg_q->view().slice(1, b.q0, b.q0 + b.tq);
    r.options.segment_ids_kv = c.seg_kv->view().slice(1, b.k0, b.k0 + b.tk);
  }
  r.options.return_lse = true;
  return r;
}

std::vector<CaseSpec> kernel_specs() {
  std::vector<CaseSpec> v;
  auto spec = [](std::int64_t Hq, std::int64_t Hkv) {
    CaseSpec s;
    s.B = 2, s.Tq = 70, s.Tk = 70, s.Hq = Hq, s.Hkv = Hkv, s.D = 24;
    return s;
  };
  CaseSpec s = spec(2, 1);
  v.push_back(s);  // causal
  s = spec(2, 2), s.window = Window{9, 2}, s.causal = false;
  v.push_back(s);
  s = spec(4, 2), s.chunk = 16, s.segments = true;
  v.push_back(s);
  s = spec(2, 1), s.window = Window{12, 0}, s.soft_cap = 5.0, s.sinks = true, s.Dv = 16;
  v.push_back(s);
  s = spec(3, 1), s.causal = false,
  s.mask = Mask::per_head({Mask::causal(), Mask::local(4, 4), Mask::chunked_causal(11)});
  v.push_back(s);
  s = spec(2, 1), s.causal = false, s.mask = Mask::local(2, 0) | Mask::chunked_causal(13);
  v.push_back(s);
  return v;
}

const std::vector<Block>& kernel_blocks() {
  static const std::vector<Block> b = {{0, 70, 0, 70},
                                       {35, 35, 0, 35},
                                       {35, 35, 35, 35},
                                       {18, 17, 30, 40},
                                       {0, 35, 35, 35} /* empty under causal */,
                                       {40, 30, 0, 70}};
  return b;
}

Attention attention_on(const std::string& op, Backend backend) {
  OperationMetadata md = registry().entry(op).defaults;
  md.backends = {backend};
  md.gpu.allow_software = true;
  md.fallbacks = {};  // the operator's own kernel, also without causal
  return registry().get(op, md);
}

void expect_blocks_match_oracle(Backend backend) {
  std::uint64_t seed = 40;
  for (const CaseSpec& spec : kernel_specs()) {
    const Case c = make_case(spec, ++seed);
    for (const Block& b : kernel_blocks()) {
      const BlockCall call = block_call(c, b);
      const Tensor dout = random_tensor(DType::f32, {c.B, b.tq, c.Hq, c.Dv}, seed * 13 + 5);
      for (const char* op : {"vanilla", "blocksparse", "flash_attn2"}) {
        SCOPED_TRACE(std::string(op) + " " + std::string(backend_name(backend)) + " block q0=" +
                     std::to_string(b.q0) + " tq=" + std::to_string(b.tq) + " k0=" + std::to_string(b.k0) +
                     " tk=" + std::to_string(b.tk) + " " + call.options.mask->key() + " " + c.describe());
        const Attention attn = attention_on(op, backend);
        const AttentionOutput out = attn(call.q, call.k, call.v, call.options);
        ASSERT_EQ(out.decision.backend, backend) << out.decision.to_json();
        const AttentionProblem p = make_problem(call.q, call.k, call.v, call.options, attn.metadata());
        const AttentionBuffers got{out.out, out.lse, std::nullopt, {}, {}};
        EXPECT_TRUE(within_tolerance(p, got));
        const AttentionGradients g = attn.backward(call.q, call.k, call.v, out, dout, call.options);
        ASSERT_EQ(g.decision.backend, backend) << g.decision.to_json();
        const BackwardProblem bp = make_backward_problem(call.q, call.k, call.v, out.out, *out.lse, dout,
                                                         call.options, attn.metadata());
        EXPECT_TRUE(gradients_match(bp, native::reference_backward_f64(bp), g));
      }
    }
  }
}

TEST(MaskOffsetKernels, NativeMatchesOracle) {
  expect_blocks_match_oracle(Backend::native);
}
TEST(MaskOffsetKernels, CpuMatchesOracle) {
  expect_blocks_match_oracle(Backend::cpu);
}
TEST(MaskOffsetKernels, GpuMatchesOracle) {
  if (!vulkan::compiled_in()) GTEST_SKIP() << "built without the Vulkan backend";
  const Availability a = vulkan::availability(attention_on("vanilla", Backend::gpu).metadata().gpu);
  if (!a.available) GTEST_SKIP() << "no Vulkan device: " << a.detail;
  expect_blocks_match_oracle(Backend::gpu);
}

// The oracle of a block that holds every key equals the global oracle's rows: at_offset means
// global positions (here with sinks, a window and segments, which the block call carries too).
TEST(MaskOffsetKernels, FullWidthBlockEqualsGlobalRows) {
  CaseSpec s;
  s.B = 2, s.Tq = 50, s.Tk = 64, s.Hq = 2, s.Hkv = 1, s.D = 16, s.window = Window{7, 0}, s.segments = true,
  s.sinks = true, s.chunk = 20;
  const Case c = make_case(s, 77);
  const AttentionProblem gp = problem_for(c);
  const native::ReferenceResult global = native::reference_attention_f64(gp, false);
  const Block b{17, 21, 0, 64};
  const BlockCall call = block_call(c, b);
  const AttentionProblem bp = make_problem(call.q, call.k, call.v, call.options, OperationMetadata{});
  const native::ReferenceResult block = native::reference_attention_f64(bp, false);
  for (std::int64_t bi = 0; bi < c.B; ++bi)
    for (std::int64_t i = 0; i < b.tq; ++i)
      for (std::int64_t h = 0; h < c.Hq; ++h) {
        const auto g_lse = global.lse[static_cast<std::size_t>((bi * c.Hq + h) * c.Tq + b.q0 + i)];
        const auto b_lse = block.lse[static_cast<std::size_t>((bi * c.Hq + h) * b.tq + i)];
        EXPECT_EQ(g_lse, b_lse);
        for (std::int64_t d = 0; d < c.Dv; ++d)
          EXPECT_EQ(global.out[static_cast<std::size_t>(((bi * c.Tq + b.q0 + i) * c.Hq + h) * c.Dv + d)],
                    block.out[static_cast<std::size_t>(((bi * b.tq + i) * c.Hq + h) * c.Dv + d)]);
      }
}

}  // namespace
}  // namespace attnops::testing
