#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"

namespace attnops {
namespace {

TEST(Tensor, ZeroInitialisedAndAligned) {
  Tensor t(DType::f32, {2, 3, 4, 5});
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(t.nbytes(), 480u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  for (std::int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.at(static_cast<std::size_t>(i)), 0.f);
}

TEST(Tensor, ViewStridesAndSlice) {
  Tensor t(DType::f32, {2, 10, 3, 4});
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(static_cast<std::size_t>(i), static_cast<float>(i));
  TensorView v = t;
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.stride(0), 120);
  EXPECT_EQ(v.stride(1), 12);
  TensorView s = v.slice(1, 2, 5);  // a KV-cache style slice: not contiguous across batch
  EXPECT_EQ(s.dim(1), 3);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.data_as<float>()[s.offset({1, 0, 2, 3})], static_cast<float>(120 + 2 * 12 + 2 * 4 + 3));
  Tensor c = Tensor::copy_of(s);
  EXPECT_EQ(c.shape(), (std::vector<std::int64_t>{2, 3, 3, 4}));
  EXPECT_EQ(c.at(static_cast<std::size_t>(36 + 2 * 4 + 3)), static_cast<float>(120 + 2 * 12 + 2 * 4 + 3));
  EXPECT_THROW(v.slice(1, 4, 11), Error);
}

TEST(Tensor, CopyConvertsDtypes) {
  Tensor t(DType::f32, {3});
  t.set(0, 1.5f), t.set(1, -2.25f), t.set(2, 1e-3f);
  Tensor h = Tensor::copy_of(t, DType::f16);
  EXPECT_EQ(h.at(0), 1.5f);
  EXPECT_EQ(h.at(1), -2.25f);
  EXPECT_NEAR(h.at(2), 1e-3f, 1e-6);
  Tensor i64(DType::i64, {2});
  i64.data_as<std::int64_t>()[0] = 7;
  i64.data_as<std::int64_t>()[1] = std::int64_t{1} << 40;
  EXPECT_THROW(Tensor::copy_of(i64, DType::i32), Error);  // does not fit
  EXPECT_THROW(Tensor::copy_of(t, DType::i32), Error);    // float -> int is not a conversion we do
}

TEST(Tensor, RejectsBadShapes) {
  EXPECT_THROW(Tensor(DType::f32, {1, 2, 3, 4, 5}), Error);
  EXPECT_THROW(Tensor(DType::f32, {-1}), Error);
  EXPECT_EQ(shape_string({2, 3}), "[2, 3]");
}

ErrorCode code_of(const std::function<void()>& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (what) *what = e.what();
    return e.code();
  }
  return ErrorCode::internal;  // no error
}

// Element and byte counts are checked products: before, Tensor(f32, {2^62}) had nbytes() == 0
// (the byte count wrapped) and set() then wrote past the heap.
TEST(TensorSizes, ByteCountsThatOverflowAreErrors) {
  std::string what;
  EXPECT_EQ(code_of([] { Tensor(DType::f32, {std::int64_t{1} << 62}); }, &what), ErrorCode::invalid_argument);
  EXPECT_NE(what.find("[4611686018427387904] of f32"), std::string::npos) << what;
  EXPECT_EQ(code_of([] {
              Tensor(DType::f32, {std::int64_t{1} << 32, std::int64_t{1} << 32, 2});
            }),
            ErrorCode::invalid_argument);  // 2^65 elements
  EXPECT_EQ(code_of([] { Tensor(DType::i64, {std::int64_t{1} << 45}); }),
            ErrorCode::invalid_argument);  // 2^48 B
  const Tensor ok(DType::f16, {3, 5});
  EXPECT_EQ(ok.nbytes(), 30u);
}

TEST(TensorSizes, ViewsCheckTheirElementCountAndExtent) {
  const float x[4] = {};
  const std::int64_t big = std::int64_t{1} << 32;
  EXPECT_EQ(code_of([&] { TensorView(x, DType::f32, {big, big, big}); }), ErrorCode::invalid_argument);
  EXPECT_EQ(code_of([&] {
              TensorView(x, DType::f32, {2, 2}, {std::int64_t{1} << 62, 1});
            }),
            ErrorCode::invalid_argument);  // the farthest element is 2^64 bytes away
  // Zero strides (a broadcast view) may claim a large shape: nothing is touched.
  const TensorView bcast(x, DType::f32, {1, 1, 1, std::int64_t{1} << 62}, {0, 0, 0, 0});
  EXPECT_EQ(bcast.numel(), std::int64_t{1} << 62);
}

// A zero-stride view claiming Dv = 2^62: the output size is checked before Tensor::copy_of
// normalises the inputs, and the error names it.
TEST(TensorSizes, HugeClaimedHeadDimIsATypedError) {
  const float x[4] = {};
  const TensorView q(x, DType::f32, {1, 1, 1, 4}), k(x, DType::f32, {1, 1, 1, 4});
  const TensorView v(x, DType::f32, {1, 1, 1, std::int64_t{1} << 62}, {0, 0, 0, 0});
  std::string what;
  EXPECT_EQ(code_of([&] { make_problem(q, k, v, {}, {}); }, &what), ErrorCode::invalid_argument);
  EXPECT_NE(what.find("out: [B, Tq, Hq, Dv]"), std::string::npos) << what;
  // A view whose innermost stride is not 1 is copied by normalisation: a copy too large names
  // the argument (here k: 2^45 keys of a broadcast row; the output is small).
  const std::int64_t Tk = std::int64_t{1} << 45;
  const TensorView k2(x, DType::f32, {1, Tk, 1, 4}, {0, 0, 0, 0}),
      v2(x, DType::f32, {1, Tk, 1, 1}, {0, 0, 0, 0});
  EXPECT_EQ(code_of([&] { make_problem(q, k2, v2, {}, {}); }, &what), ErrorCode::invalid_argument);
  EXPECT_EQ(what.rfind("k: tensor shape", 0), 0u) << what;
}

TEST(TensorSizes, LargeTensorsAreZeroAndAligned) {
  Tensor t(DType::f32, {3, 1 << 20});  // 12 MiB: mapped from the OS
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  for (std::int64_t i = 0; i < t.numel(); i += 4099) ASSERT_EQ(t.at(static_cast<std::size_t>(i)), 0.f);
  t.set(static_cast<std::size_t>(t.numel() - 1), 1.f);
  EXPECT_EQ(t.at(static_cast<std::size_t>(t.numel() - 1)), 1.f);
}

TEST(AllFinite, FindsNaNAndInfInEveryFloatDtypeAndLayout) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Tensor t(dt, {2, 3, 4, 5});
    EXPECT_TRUE(all_finite(t));
    t.set(77, std::numeric_limits<float>::infinity());
    EXPECT_FALSE(all_finite(t));
    t.set(77, 0.f);
    t.set(5, std::numeric_limits<float>::quiet_NaN());
    EXPECT_FALSE(all_finite(t));
    EXPECT_TRUE(all_finite(t.view().slice(1, 1, 3)));  // a strided view without element 5
    EXPECT_FALSE(all_finite(t.view().slice(1, 0, 1)));
  }
  EXPECT_TRUE(all_finite(Tensor(DType::i32, {4})));
}

}  // namespace
}  // namespace attnops
