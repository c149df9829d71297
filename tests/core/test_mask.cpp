#include <gtest/gtest.h>

#include "attnops/error.h"
#include "attnops/mask.h"

namespace attnops {
namespace {

// Checks row_interval against visible() on every row of a (Tq, Tk) grid.
void expect_intervals_match(const Mask& m, std::int64_t Tq, std::int64_t Tk, std::int64_t H = 1) {
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < Tq; ++i) {
      auto iv = m.row_interval(h, i, Tq, Tk);
      if (!iv) continue;
      for (std::int64_t j = 0; j < Tk; ++j)
        ASSERT_EQ(m.visible(h, i, j, Tq, Tk), j >= iv->first && j < iv->second)
            << m.key() << " h=" << h << " i=" << i << " j=" << j << " Tq=" << Tq << " Tk=" << Tk;
    }
}

TEST(Mask, CausalIsBottomRightAligned) {
  const Mask c = Mask::causal();
  // Tq=2, Tk=5: query 0 sits at position 3, query 1 at position 4.
  EXPECT_TRUE(c.visible(0, 0, 3, 2, 5));
  EXPECT_FALSE(c.visible(0, 0, 4, 2, 5));
  EXPECT_TRUE(c.visible(0, 1, 4, 2, 5));
  // Tq > Tk: the first rows see nothing.
  EXPECT_FALSE(c.visible(0, 0, 0, 5, 2));
  EXPECT_EQ(c.row_interval(0, 0, 5, 2)->second, 0);
  expect_intervals_match(c, 7, 13);
  expect_intervals_match(c, 13, 7);
}

TEST(Mask, LocalChunkedAndCombinations) {
  expect_intervals_match(Mask::local(3, 2), 20, 20);
  expect_intervals_match(Mask::causal() & Mask::local(4, 0), 9, 30);
  expect_intervals_match(Mask::chunked_causal(5), 23, 23);
  expect_intervals_match(Mask::chunked_causal(4), 6, 19);
  // chunk 4 at position 6: sees 4..6.
  EXPECT_EQ(*Mask::chunked_causal(4).row_interval(0, 6, 10, 10), (std::pair<std::int64_t, std::int64_t>{4, 7}));
  // Or of overlapping intervals is an interval; with a gap it is not.
  const Mask overlap = Mask::local(2, 0) | Mask::local(0, 2);
  expect_intervals_match(overlap, 10, 10);
  EXPECT_TRUE(overlap.row_interval(0, 5, 10, 10).has_value());
}

// Every primitive's row contains the query position p (or, when p < 0, starts at key 0), so
// and/or combinations of primitives are always intervals: row_interval must never give up on
// them, and must agree with visible() everywhere, also with Tq != Tk.
TEST(Mask, CombinationsOfPrimitivesAreIntervals) {
  const std::vector<Mask> prims = {Mask::full(), Mask::causal(), Mask::local(3, 0), Mask::local(0, 2),
                                   Mask::local(5, 5), Mask::chunked_causal(4), Mask::chunked_causal(7)};
  for (const auto& a : prims)
    for (const auto& b : prims)
      for (const Mask& m : {a & b, a | b, (a | b) & Mask::causal(), (a & b) | Mask::local(1, 0)})
        for (auto [Tq, Tk] : {std::pair<std::int64_t, std::int64_t>{12, 12}, {5, 17}, {17, 5}}) {
          for (std::int64_t i = 0; i < Tq; ++i) ASSERT_TRUE(m.row_interval(0, i, Tq, Tk).has_value()) << m.key();
          expect_intervals_match(m, Tq, Tk);
        }
}

TEST(Mask, PerHeadMasks) {
  const Mask m = Mask::per_head({Mask::causal(), Mask::local(1, 1), Mask::full()});
  EXPECT_TRUE(m.head_dependent());
  EXPECT_EQ(m.num_heads(), 3);
  EXPECT_FALSE(m.visible(0, 0, 5, 8, 8));
  EXPECT_FALSE(m.visible(1, 0, 5, 8, 8));
  EXPECT_TRUE(m.visible(2, 0, 5, 8, 8));
  expect_intervals_match(m, 8, 8, 3);
  // Identical per-head masks collapse to one shared mask.
  EXPECT_FALSE(Mask::per_head({Mask::causal(), Mask::causal()}).head_dependent());
}

TEST(Mask, KeysAreCanonical) {
  EXPECT_EQ(Mask::full().key(), "full");
  EXPECT_EQ((Mask::full() & Mask::causal()).key(), "causal");
  EXPECT_EQ((Mask::causal() & Mask::local(32, 0)).key(), "(causal&local(32,0))");
  EXPECT_EQ((Mask::causal() | Mask::full()).kind(), Mask::Kind::full);
  EXPECT_NE(Mask::local(1, 2).key(), Mask::local(2, 1).key());
}

TEST(Mask, RejectsBadParameters) {
  EXPECT_THROW(Mask::local(-1, 0), Error);
  EXPECT_THROW(Mask::chunked_causal(0), Error);
  EXPECT_THROW(Mask::per_head({}), Error);
}

// Per-head masks built for different head counts cannot be combined: before, & of a 4-head and
// a 2-head mask was accepted for Hq = 4 and heads 2-3 silently reused heads 0-1 (h % 2).
TEST(MaskPerHead, MismatchedHeadCountsAreAnError) {
  const Mask four =
      Mask::per_head({Mask::causal(), Mask::local(1, 0), Mask::full(), Mask::chunked_causal(2)});
  const Mask two = Mask::per_head({Mask::local(2, 2), Mask::causal()});
  for (auto combine : {+[](const Mask&a, const Mask&b) { return a & b; },
                       +[](const Mask&a, const Mask&b) { return a | b; }}) {
    try {
      combine(four, two);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
      EXPECT_NE(std::string(e.what()).find("4 and 2 q heads"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Mask::per_head({two, Mask::causal(), Mask::full()}), Error);  // a 2-head mask as head 0 of 3
  // Same counts combine; head-independent masks combine with anything.
  EXPECT_EQ((four & four).num_heads(), 4);
  EXPECT_EQ((four & Mask::causal()).num_heads(), 4);
  EXPECT_EQ((two | Mask::local(3, 0)).num_heads(), 2);
}

}  // namespace
}  // namespace attnops
