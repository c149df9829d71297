// Bad input: every malformed call is a typed attnops::Error whose message names the argument,
// the shape found and the shape expected. Nothing crashes, nothing returns garbage.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "tests/support/testing.h"

namespace attnops {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct Inputs {
  Tensor q{DType::f32, {2, 8, 4, 16}};
  Tensor k{DType::f32, {2, 12, 2, 16}};
  Tensor v{DType::f32, {2, 12, 2, 24}};
};

// Runs make_problem and returns the error (fails the test when there is none).
Error error_of(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionOptions& o = {},
               const OperationMetadata& md = {}) {
  try {
    make_problem(q, k, v, o, md);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(ErrorCode::internal, "");
}

TEST(Validation, GoodInputsPass) {
  Inputs in;
  const AttentionProblem p = make_problem(in.q, in.k, in.v, {}, {});
  EXPECT_EQ(p.group(), 2);
  EXPECT_EQ(p.Dv, 24);
  EXPECT_DOUBLE_EQ(p.scale, 0.25);
}

TEST(Validation, WrongRank) {
  Inputs in;
  Tensor q3(DType::f32, {2, 8, 64});
  Error e = error_of(q3, in.k, in.v);
  EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("q:"), HasSubstr("rank 4 [B, Tq, Hq, D]"), HasSubstr("[2, 8, 64]")));
}

TEST(Validation, MismatchedBatchHeadDimAndLength) {
  Inputs in;
  Tensor kb(DType::f32, {3, 12, 2, 16});
  EXPECT_THAT(error_of(in.q, kb, in.v).what(),
              AllOf(HasSubstr("k:"), HasSubstr("B=2"), HasSubstr("[3, 12, 2, 16]")));
  Tensor kd(DType::f32, {2, 12, 2, 20});
  EXPECT_THAT(error_of(in.q, kd, in.v).what(),
              AllOf(HasSubstr("k:"), HasSubstr("D=16"), HasSubstr("[2, 12, 2, 20]")));
  Tensor vt(DType::f32, {2, 11, 2, 24});
  Error e = error_of(in.q, in.k, vt);
  EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("v:"), HasSubstr("Tk=12"), HasSubstr("[2, 11, 2, 24]")));
}

TEST(Validation, HeadsNotDivisible) {
  Inputs in;
  Tensor k3(DType::f32, {2, 12, 3, 16}), v3(DType::f32, {2, 12, 3, 24});
  Error e = error_of(in.q, k3, v3);
  EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("Hq % Hkv"), HasSubstr("Hq=4"), HasSubstr("Hkv=3")));
}

TEST(Validation, DtypesMustAgreeUnlessARuntimeDtypeIsSet) {
  Inputs in;
  Tensor kh = Tensor::copy_of(in.k, DType::f16);
  Error e = error_of(in.q, kh, in.v);
  EXPECT_EQ(e.code(), ErrorCode::unsupported_dtype);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("k:"), HasSubstr("f16"), HasSubstr("f32")));
  OperationMetadata md;
  md.runtime_dtype = DType::bf16;
  EXPECT_EQ(make_problem(in.q, kh, in.v, {}, md).dtype, DType::bf16);
  Tensor qi(DType::i32, {2, 8, 4, 16});
  EXPECT_EQ(error_of(qi, in.k, in.v).code(), ErrorCode::unsupported_dtype);
  md.runtime_dtype = DType::i32;
  EXPECT_THAT(error_of(in.q, in.k, in.v, {}, md).what(), HasSubstr("runtime_dtype"));
  OperationMetadata sm;
  sm.runtime_softmax_dtype = DType::f16;
  EXPECT_THAT(error_of(in.q, in.k, in.v, {}, sm).what(), HasSubstr("runtime_softmax_dtype"));
}

TEST(Validation, NonFiniteScale) {
  Inputs in;
  for (double s : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    OperationMetadata md;
    md.softmax_scale = s;
    Error e = error_of(in.q, in.k, in.v, {}, md);
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_THAT(e.what(), HasSubstr("softmax_scale"));
  }
}

TEST(Validation, WindowChunkSoftCap) {
  Inputs in;
  EXPECT_THAT(error_of(in.q, in.k, in.v, {.sliding_window = Window{-1, 0}}).what(),
              AllOf(HasSubstr("sliding_window"), HasSubstr("(-1, 0)")));
  EXPECT_THAT(error_of(in.q, in.k, in.v, {.sliding_window = Window{3, -2}}).what(),
              HasSubstr("sliding_window"));
  EXPECT_THAT(error_of(in.q, in.k, in.v, {.chunk_size = 0}).what(), HasSubstr("chunk_size"));
  EXPECT_THAT(error_of(in.q, in.k, in.v, {.logits_soft_cap = 0.0}).what(), HasSubstr("logits_soft_cap"));
  EXPECT_THAT(error_of(in.q, in.k, in.v, {.logits_soft_cap = std::nan("")}).what(),
              HasSubstr("logits_soft_cap"));
}

TEST(Validation, SegmentIds) {
  Inputs in;
  Tensor sq(DType::i32, {2, 8}), skv(DType::i32, {2, 12}), bad(DType::i32, {2, 9}), fl(DType::f32, {2, 8});
  EXPECT_THAT(error_of(in.q, in.k, in.v, {.segment_ids_q = sq.view()}).what(), HasSubstr("segment_ids_kv"));
  Error e = error_of(in.q, in.k, in.v, {.segment_ids_q = bad.view(), .segment_ids_kv = skv.view()});
  EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("segment_ids_q"), HasSubstr("[B=2, Tq=8]"), HasSubstr("[2, 9]")));
  EXPECT_EQ(error_of(in.q, in.k, in.v, {.segment_ids_q = fl.view(), .segment_ids_kv = skv.view()}).code(),
            ErrorCode::unsupported_dtype);
  Tensor s64(DType::i64, {2, 8});  // i64 is accepted and narrowed
  EXPECT_NO_THROW(
      make_problem(in.q, in.k, in.v, {.segment_ids_q = s64.view(), .segment_ids_kv = skv.view()}, {}));
}

TEST(Validation, BiasShapes) {
  Inputs in;
  for (auto shape : {std::vector<std::int64_t>{2, 4, 8, 12}, {1, 4, 8, 12}, {2, 1, 8, 12}, {1, 1, 8, 12}}) {
    Tensor b(DType::f32, shape);
    EXPECT_NO_THROW(make_problem(in.q, in.k, in.v, {.bias = b.view()}, {})) << shape_string(shape);
  }
  Tensor b(DType::f32, {2, 3, 8, 12});
  Error e = error_of(in.q, in.k, in.v, {.bias = b.view()});
  EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("bias:"), HasSubstr("Hq=4 or 1"), HasSubstr("[2, 3, 8, 12]")));
  Tensor b3(DType::f32, {8, 12});
  EXPECT_THAT(error_of(in.q, in.k, in.v, {.bias = b3.view()}).what(), HasSubstr("bias:"));
}

TEST(Validation, Sinks) {
  Inputs in;
  Tensor s(DType::f32, {3});
  Error e = error_of(in.q, in.k, in.v, {.sinks = s.view()});
  EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
  EXPECT_THAT(e.what(), AllOf(HasSubstr("softmax_aux"), HasSubstr("[Hq=4]"), HasSubstr("[3]")));
}

TEST(Validation, PerHeadMaskHeadCount) {
  Inputs in;
  Mask m = Mask::per_head({Mask::causal(), Mask::full()});
  EXPECT_THAT(error_of(in.q, in.k, in.v, {.mask = m}).what(),
              AllOf(HasSubstr("mask"), HasSubstr("expected 4")));
}

TEST(Validation, BlockSizesAndThreads) {
  Inputs in;
  OperationMetadata md;
  md.blocksize_q = 0;
  EXPECT_THAT(error_of(in.q, in.k, in.v, {}, md).what(), HasSubstr("blocksize_q"));
  md = {};
  md.num_threads = -1;
  EXPECT_THAT(error_of(in.q, in.k, in.v, {}, md).what(), HasSubstr("num_threads"));
}

TEST(Validation, ZeroHeadDim) {
  Tensor q(DType::f32, {1, 4, 2, 0}), k(DType::f32, {1, 4, 2, 0}), v(DType::f32, {1, 4, 2, 8});
  EXPECT_THAT(error_of(q, k, v).what(), HasSubstr("head_dim"));
}

TEST(Validation, ErrorsSurfaceThroughTheRegistry) {
  Inputs in;
  Tensor q3(DType::f32, {2, 8, 64});
  try {
    registry().get("blocksparse")(q3, in.k, in.v);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
  }
}

TEST(Validation, EmptyProblemsAreFine) {
  // No keys: every row is fully masked: output 0, lse -inf. No queries: empty output.
  Tensor q(DType::f32, {1, 3, 2, 8}), k(DType::f32, {1, 0, 2, 8}), v(DType::f32, {1, 0, 2, 8});
  for (const char* op : {"vanilla", "flash_attn2"}) {
    auto out = registry().get(op)(q, k, v, {.causal = false, .return_lse = true});
    ASSERT_TRUE(out.lse.has_value());
    for (std::int64_t i = 0; i < out.lse->numel(); ++i)
      EXPECT_TRUE(std::isinf(out.lse->at(static_cast<std::size_t>(i))));
    for (std::int64_t i = 0; i < out.out.numel(); ++i)
      EXPECT_EQ(out.out.at(static_cast<std::size_t>(i)), 0.f);
  }
  Tensor q0(DType::f32, {1, 0, 2, 8}), k1(DType::f32, {1, 5, 2, 8}), v1(DType::f32, {1, 5, 2, 8});
  EXPECT_EQ(registry().get("vanilla")(q0, k1, v1).out.numel(), 0);
}

// Scales and soft caps that the fp32 kernels cannot honour are refused: before, --scale 1e38
// gave all-NaN (vanilla) or all-zero (flash) outputs where the fp64 oracle is finite.
TEST(ValidationRanges, ScaleThatCarriesLogitsOutOfF32) {
  const testing::Case c = testing::make_case(testing::CaseSpec{}, 3);  // q, k uniform in [-1, 1), D = 8
  for (double scale : {1e38, -1e38, 3e38}) {
    OperationMetadata md;
    md.softmax_scale = scale;
    const Error e = error_of(c.q, c.k, c.v, {}, md);
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << scale;
    EXPECT_THAT(e.what(), HasSubstr("softmax_scale"));
    EXPECT_THAT(e.what(), HasSubstr("f32 range"));
  }
  // Large scales that stay in range run (the bound uses the inputs' magnitudes).
  for (double scale : {1.0, 1e3, 1e30}) {
    OperationMetadata md;
    md.softmax_scale = scale;
    EXPECT_NO_THROW(make_problem(c.q, c.k, c.v, {}, md)) << scale;
  }
  Tensor tiny_q = Tensor::copy_of(c.q);
  for (std::int64_t i = 0; i < tiny_q.numel(); ++i) tiny_q.set(static_cast<std::size_t>(i), 1e-30f);
  OperationMetadata md;
  md.softmax_scale = 1e38;
  EXPECT_NO_THROW(make_problem(tiny_q, c.k, c.v, {}, md));  // |scale * q.k| <= 8e8
}

TEST(ValidationRanges, SoftCapOutsideTheNormalF32Range) {
  const testing::Case c = testing::make_case(testing::CaseSpec{}, 3);
  for (double cap : {1e39, 1e-39, 1e-45}) {
    AttentionOptions o;
    o.logits_soft_cap = cap;
    const Error e = error_of(c.q, c.k, c.v, o, {});
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << cap;
    EXPECT_THAT(e.what(), HasSubstr("logits_soft_cap"));
  }
  AttentionOptions o;
  o.logits_soft_cap = 1e-30;
  EXPECT_NO_THROW(make_problem(c.q, c.k, c.v, o, {}));
}

TEST(ValidationRanges, OutputsLargerThanTheMaximumNameTheOutput) {
  const float x[4] = {};
  const std::int64_t T = std::int64_t{1} << 24;
  const TensorView q(x, DType::f32, {1, T, 1, 1}, {0, 0, 0, 0}), k(x, DType::f32, {1, T, 1, 1}, {0, 0, 0, 0});
  AttentionOptions o;
  o.return_weights = true;  // [1, 1, 2^24, 2^24] f32 = 2^50 bytes
  const Error e = error_of(q, k, k, o, {});
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_THAT(e.what(), HasSubstr("weights: [B, Hq, Tq, Tk]"));
}

}  // namespace
}  // namespace attnops
