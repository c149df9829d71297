#include <gtest/gtest.h>

#include "attnops/error.h"
#include "attnops/tensor.h"

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

}  // namespace
}  // namespace attnops
