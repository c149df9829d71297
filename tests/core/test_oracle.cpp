// The oracle checked against answers computed by hand, so that every other test's reference is
// itself tested. With q = 0 every visible logit is 0 (plus bias), so softmax is uniform over the
// visible keys and the output is the mean of their values: masks, GQA, sinks and lse can be
// checked in closed form.
#include <gtest/gtest.h>

#include <cmath>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"

namespace attnops {
namespace {

// v[b, j, h, d] = 1000 * h + j (so an output tells which keys and which kv head were read).
Tensor ramp_v(std::int64_t B, std::int64_t Tk, std::int64_t H, std::int64_t D) {
  Tensor v(DType::f32, {B, Tk, H, D});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < Tk; ++j)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          v.set(static_cast<std::size_t>(((b * Tk + j) * H + h) * D + d), static_cast<float>(1000 * h + j));
  return v;
}

native::ReferenceResult run(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  return native::reference_attention_f64(make_problem(q, k, v, o, {}), false);
}

TEST(Oracle, CausalBottomRightMeanOfVisibleKeys) {
  const std::int64_t Tq = 3, Tk = 7;
  Tensor q(DType::f32, {1, Tq, 1, 4}), k(DType::f32, {1, Tk, 1, 4});
  Tensor v = ramp_v(1, Tk, 1, 4);
  auto r = run(q, k, v, {});
  for (std::int64_t i = 0; i < Tq; ++i) {
    const std::int64_t p = i + Tk - Tq;  // sees keys 0..p: mean p/2, lse log(p+1)
    EXPECT_DOUBLE_EQ(r.out[static_cast<std::size_t>(i * 4)], p / 2.0);
    EXPECT_NEAR(r.lse[static_cast<std::size_t>(i)], std::log(static_cast<double>(p + 1)), 1e-12);
  }
}

TEST(Oracle, WindowAndChunk) {
  const std::int64_t T = 10;
  Tensor q(DType::f32, {1, T, 1, 2}), k(DType::f32, {1, T, 1, 2});
  Tensor v = ramp_v(1, T, 1, 2);
  auto w = run(q, k, v, {.causal = false, .sliding_window = Window{2, 1}});
  EXPECT_DOUBLE_EQ(w.out[5 * 2], (3 + 4 + 5 + 6) / 4.0);  // keys 3..6
  EXPECT_DOUBLE_EQ(w.out[0], (0 + 1) / 2.0);              // keys 0..1
  auto c = run(q, k, v, {.chunk_size = 4});
  EXPECT_DOUBLE_EQ(c.out[6 * 2], (4 + 5 + 6) / 3.0);  // chunk [4, 8), causal
  EXPECT_DOUBLE_EQ(c.out[8 * 2], 8.0);
}

TEST(Oracle, GqaReadsKvHeadHOverGroup) {
  Tensor q(DType::f32, {1, 2, 8, 4}), k(DType::f32, {1, 5, 2, 4});
  Tensor v = ramp_v(1, 5, 2, 4);
  auto r = run(q, k, v, {.causal = false});
  for (std::int64_t h = 0; h < 8; ++h)  // q heads 0-3 read kv head 0, 4-7 read kv head 1
    EXPECT_DOUBLE_EQ(r.out[static_cast<std::size_t>((1 * 8 + h) * 4)], 1000.0 * (h / 4) + 2.0);
}

TEST(Oracle, SinkTakesMassButNotLse) {
  Tensor q(DType::f32, {1, 1, 1, 4}), k(DType::f32, {1, 4, 1, 4});
  Tensor v = ramp_v(1, 4, 1, 4);
  Tensor s(DType::f32, {1});
  s.set(0, 0.5f);
  auto r = run(q, k, v, {.causal = false, .sinks = s.view()});
  const double denom = 4 + std::exp(0.5);
  EXPECT_NEAR(r.out[0], (0 + 1 + 2 + 3) / denom, 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-12);
}

TEST(Oracle, BiasSoftCapAndScale) {
  // One query, two keys; q.k = 2 for key 0, 0 for key 1.
  Tensor q(DType::f32, {1, 1, 1, 1}), k(DType::f32, {1, 2, 1, 1}), v(DType::f32, {1, 2, 1, 1});
  q.set(0, 1.f), k.set(0, 2.f), k.set(1, 0.f), v.set(0, 1.f), v.set(1, 0.f);
  Tensor bias(DType::f32, {1, 1, 1, 2});
  bias.set(1, 0.25f);
  auto p = make_problem(q, k, v, {.causal = false, .bias = bias.view(), .logits_soft_cap = 1.5}, {});
  auto r = native::reference_attention_f64(p, true);
  const double s0 = 1.5 * std::tanh(2.0 / 1.5), s1 = 0.25;  // scale 1/sqrt(1): cap first, then bias
  EXPECT_NEAR(r.out[0], std::exp(s0) / (std::exp(s0) + std::exp(s1)), 1e-12);
  EXPECT_NEAR(r.weights[1], std::exp(s1) / (std::exp(s0) + std::exp(s1)), 1e-12);
}

TEST(Oracle, FullyMaskedRowsAreZeroWithMinusInfLse) {
  Tensor q(DType::f32, {1, 4, 1, 2}), k(DType::f32, {1, 2, 1, 2});
  Tensor v = ramp_v(1, 2, 1, 2);
  auto r = run(q, k, v, {});  // Tq > Tk causal: rows 0 and 1 sit before the first key
  for (int i : {0, 1}) {
    EXPECT_EQ(r.out[static_cast<std::size_t>(i * 2)], 0.0);
    EXPECT_TRUE(std::isinf(r.lse[static_cast<std::size_t>(i)]) && r.lse[static_cast<std::size_t>(i)] < 0);
  }
  EXPECT_DOUBLE_EQ(r.out[3 * 2], 0.5);
}

TEST(Oracle, SegmentsAndPerHeadMask) {
  Tensor q(DType::f32, {1, 4, 2, 2}), k(DType::f32, {1, 4, 1, 2});
  Tensor v = ramp_v(1, 4, 1, 2);
  Tensor sq(DType::i32, {1, 4}), skv(DType::i32, {1, 4});
  for (int i = 0; i < 4; ++i)
    sq.data_as<std::int32_t>()[i] = i < 2 ? 0 : 1, skv.data_as<std::int32_t>()[i] = i < 3 ? 0 : 1;
  auto r = run(q, k, v,
               {.causal = false,
                .segment_ids_q = sq.view(),
                .segment_ids_kv = skv.view(),
                .mask = Mask::per_head({Mask::full(), Mask::local(0, 0)})});
  EXPECT_DOUBLE_EQ(r.out[(0 * 2 + 0) * 2], 1.0);  // row 0, head 0: keys 0..2 (segment 0)
  EXPECT_DOUBLE_EQ(r.out[(0 * 2 + 1) * 2], 0.0);  // row 0, head 1: key 0 only
  EXPECT_DOUBLE_EQ(r.out[(2 * 2 + 0) * 2], 3.0);  // row 2, head 0: key 3 (segment 1)
  EXPECT_EQ(r.out[(2 * 2 + 1) * 2], 0.0);         // row 2, head 1: key 2 is segment 0: empty row
  EXPECT_TRUE(std::isinf(r.lse[1 * 4 + 2]));
}

}  // namespace
}  // namespace attnops
