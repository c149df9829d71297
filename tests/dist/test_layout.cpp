// Layouts and the shard / unshard helpers.
#include <gtest/gtest.h>

#include <cstring>

#include "attnops/dist/layout.h"
#include "attnops/error.h"
#include "tests/support/testing.h"

namespace attnops::dist {
namespace {

TEST(Layout, ZigzagHoldsChunksRAnd2PMinus1MinusR) {
  const ShardLayout l(Layout::zigzag, 16, 2);  // 4 chunks of 4
  ASSERT_EQ(l.chunks(0).size(), 2u);
  EXPECT_EQ(l.chunks(0)[0].begin, 0);
  EXPECT_EQ(l.chunks(0)[1].begin, 12);
  EXPECT_EQ(l.chunks(1)[0].begin, 4);
  EXPECT_EQ(l.chunks(1)[1].begin, 8);
  EXPECT_EQ(l.global_position(0, 5), 13);
  const ShardLayout c(Layout::contiguous, 10, 3);  // 3, 3, 4
  EXPECT_EQ(c.shard_length(0), 3);
  EXPECT_EQ(c.shard_length(2), 4);
  EXPECT_EQ(c.chunks(2)[0].begin, 6);
  // Lengths not divisible by the chunk count, and shorter than it: chunks differ by at most one.
  for (std::int64_t T : {0, 1, 5, 7, 37, 101})
    for (int P : {1, 2, 3, 4})
      for (Layout k : {Layout::zigzag, Layout::contiguous}) {
        const ShardLayout s(k, T, P);
        std::int64_t total = 0, lo = T, hi = 0;
        std::vector<int> seen(static_cast<std::size_t>(T), 0);
        for (int r = 0; r < P; ++r) {
          total += s.shard_length(r);
          for (const Chunk& ch : s.chunks(r)) {
            lo = std::min(lo, ch.size()), hi = std::max(hi, ch.size());
            for (std::int64_t i = ch.begin; i < ch.end; ++i) ++seen[static_cast<std::size_t>(i)];
          }
        }
        EXPECT_EQ(total, T);
        EXPECT_LE(hi - lo, 1);
        for (int x : seen) EXPECT_EQ(x, 1);
      }
  EXPECT_THROW(ShardLayout(Layout::zigzag, 4, 0), Error);
  EXPECT_THROW(ShardLayout(Layout::zigzag, -1, 2), Error);
}

TEST(Layout, ShardThenUnshardIsTheIdentity) {
  const Tensor q = attnops::testing::random_tensor(DType::f32, {2, 37, 3, 5}, 1);
  const Tensor lse = attnops::testing::random_tensor(DType::f32, {2, 3, 37}, 2);
  const Tensor seg = attnops::testing::random_segments(2, 37, 3);
  for (Layout k : {Layout::zigzag, Layout::contiguous}) {
    const ShardLayout l(k, 37, 3);
    Tensor q2(DType::f32, {2, 37, 3, 5}), lse2(DType::f32, {2, 3, 37}), seg2(DType::i32, {2, 37});
    for (int r = 0; r < 3; ++r) {
      const Tensor a = shard(q, l, r), b = shard(lse, l, r, 2), c = shard(seg, l, r);
      EXPECT_EQ(a.dim(1), l.shard_length(r));
      EXPECT_EQ(b.dim(2), l.shard_length(r));
      EXPECT_EQ(a.at(0), q.at(static_cast<std::size_t>(l.global_position(r, 0) * 15)));
      unshard_into(a, l, r, q2);
      unshard_into(b, l, r, lse2, 2);
      unshard_into(c, l, r, seg2);
    }
    EXPECT_EQ(std::memcmp(q.data(), q2.data(), q.nbytes()), 0);
    EXPECT_EQ(std::memcmp(lse.data(), lse2.data(), lse.nbytes()), 0);
    EXPECT_EQ(std::memcmp(seg.data(), seg2.data(), seg.nbytes()), 0);
  }
  // A strided view shards like its copy.
  const Tensor big = attnops::testing::random_tensor(DType::f32, {2, 50, 3, 5}, 4);
  const ShardLayout l(Layout::zigzag, 37, 2);
  const Tensor a = shard(big.view().slice(1, 5, 42), l, 1),
               b = shard(Tensor::copy_of(big.view().slice(1, 5, 42)), l, 1);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  EXPECT_THROW(shard(q, ShardLayout(Layout::zigzag, 36, 2), 0), Error);
}

TEST(Layout, DefaultsByMask) {
  AttentionOptions o;
  EXPECT_EQ(default_layout(o), Layout::zigzag);
  o.sliding_window = Window{4, 0};
  EXPECT_EQ(default_layout(o), Layout::contiguous);
  o = {};
  o.causal = false;
  EXPECT_EQ(default_layout(o), Layout::contiguous);
  EXPECT_EQ(parse_layout("zigzag"), Layout::zigzag);
  EXPECT_EQ(parse_layout("striped"), std::nullopt);
}

}  // namespace
}  // namespace attnops::dist
