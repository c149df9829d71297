// Block map: exact tile classification, partial bitsets (and their transposed copy), content
// deduplication, per-head maps, Tq != Tk alignment, and the LRU cache.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "attnops/attnops.h"
#include "backends/common/block_map_impl.h"

namespace attnops {
namespace {

// Checks a map against Mask::visible element by element: every tile's class, every listed
// tile's bits (both layouts), the counts, the visible-pair total, and that partial bitsets are
// shared exactly when their contents are equal.
void expect_matches_brute_force(const Mask& mask, std::int64_t Hq, std::int64_t Tq, std::int64_t Tk,
                                std::int64_t bq, std::int64_t bk) {
  SCOPED_TRACE(mask.key() + " Hq=" + std::to_string(Hq) + " Tq=" + std::to_string(Tq) +
               " Tk=" + std::to_string(Tk) + " bq=" + std::to_string(bq) + " bk=" + std::to_string(bk));
  const BlockMap m = build_block_map(mask, Hq, Tq, Tk, bq, bk);
  ASSERT_EQ(m.nq, (Tq + bq - 1) / bq);
  ASSERT_EQ(m.nk, (Tk + bk - 1) / bk);
  ASSERT_EQ(m.heads, mask.head_dependent() ? Hq : 1);
  std::int64_t empty = 0, full = 0, partial = 0;
  double pairs = 0;
  std::map<std::vector<bool>, std::int32_t> index_of_content;
  std::map<std::int32_t, std::vector<bool>> content_of_index;
  for (std::int64_t hh = 0; hh < m.heads; ++hh) {
    for (std::int64_t qb = 0; qb < m.nq; ++qb) {
      const auto row = m.row(hh, qb);
      std::size_t next = 0;
      for (std::int64_t kb = 0; kb < m.nk; ++kb) {
        std::vector<bool> content(static_cast<std::size_t>(bq * bk), false);
        std::int64_t vis = 0, total = 0;
        for (std::int64_t r = 0; r < bq && qb * bq + r < Tq; ++r)
          for (std::int64_t c = 0; c < bk && kb * bk + c < Tk; ++c) {
            const bool v = mask.visible(hh, qb * bq + r, kb * bk + c, Tq, Tk);
            content[static_cast<std::size_t>(r * bk + c)] = v;
            vis += v;
            ++total;
          }
        pairs += static_cast<double>(vis);
        if (vis == 0) {
          ++empty;
          ASSERT_TRUE(next >= row.size() || row[next].kv != kb)
              << "empty tile listed: qb=" << qb << " kb=" << kb;
          continue;
        }
        ASSERT_LT(next, row.size()) << "non-empty tile missing: qb=" << qb << " kb=" << kb;
        const BlockMap::Block blk = row[next++];
        ASSERT_EQ(blk.kv, kb);
        if (vis == total) {
          ++full;
          EXPECT_TRUE(blk.is_full()) << "qb=" << qb << " kb=" << kb;
          continue;
        }
        ++partial;
        ASSERT_FALSE(blk.is_full()) << "qb=" << qb << " kb=" << kb;
        for (std::int64_t r = 0; r < bq; ++r)
          for (std::int64_t c = 0; c < bk; ++c) {
            const bool want = content[static_cast<std::size_t>(r * bk + c)];
            ASSERT_EQ(m.partial_visible(blk.partial, r, c), want)
                << "qb=" << qb << " kb=" << kb << " r=" << r << " c=" << c;
            const bool t = (m.partial_col(blk.partial, c)[r >> 6] >> (r & 63)) & 1u;
            ASSERT_EQ(t, want) << "transposed bits, r=" << r << " c=" << c;
          }
        // Deduplication: one index per distinct content and one content per index.
        auto [it, inserted] = index_of_content.emplace(content, blk.partial);
        if (!inserted) {
          EXPECT_EQ(it->second, blk.partial) << "identical partial tiles stored twice";
        }
        auto [it2, inserted2] = content_of_index.emplace(blk.partial, content);
        if (!inserted2) {
          EXPECT_EQ(it2->second, content) << "different partial tiles share an index";
        }
      }
      EXPECT_EQ(next, row.size());
    }
  }
  EXPECT_EQ(m.num_empty, empty);
  EXPECT_EQ(m.num_full, full);
  EXPECT_EQ(m.num_partial, partial);
  EXPECT_EQ(m.num_unique_partial, static_cast<std::int64_t>(index_of_content.size()));
  EXPECT_EQ(m.visible_pairs, pairs);
  EXPECT_EQ(m.num_empty + m.num_full + m.num_partial, m.heads * m.nq * m.nk);
}

TEST(BlockMap, CausalSquareHasTriangleOfTilesWithOnePartialPerRow) {
  for (std::int64_t n : {1, 2, 5, 8, 16}) {
    const std::int64_t b = 64, T = n * b;
    const BlockMap m = build_block_map(Mask::causal(), 8, T, T, b, b);
    EXPECT_EQ(m.heads, 1);
    EXPECT_EQ(m.num_blocks(), n * (n + 1) / 2);
    EXPECT_EQ(m.num_partial, n);
    EXPECT_EQ(m.num_full, n * (n - 1) / 2);
    EXPECT_EQ(m.num_empty, n * (n - 1) / 2);
    EXPECT_EQ(m.num_unique_partial, 1) << "the diagonal tiles are identical";
    EXPECT_EQ(m.visible_pairs, static_cast<double>(T) * (T + 1) / 2);
  }
}

TEST(BlockMap, WindowCounts) {
  // local(64, 0), 8 x 8 tiles of 64: each q block sees its diagonal tile (lower triangle) and,
  // from the second block on, the tile before it (upper triangle); two distinct contents.
  const BlockMap m = build_block_map(Mask::local(64, 0), 1, 512, 512, 64, 64);
  EXPECT_EQ(m.num_partial, 15);
  EXPECT_EQ(m.num_full, 0);
  EXPECT_EQ(m.num_empty, 64 - 15);
  EXPECT_EQ(m.num_unique_partial, 2);
  expect_matches_brute_force(Mask::local(64, 0), 1, 512, 512, 64, 64);
  expect_matches_brute_force(Mask::local(100, 30), 1, 300, 300, 64, 32);
  expect_matches_brute_force(Mask::causal() & Mask::local(7, 0), 1, 97, 130, 16, 24);
}

TEST(BlockMap, ChunkedCausalCounts) {
  // chunk 128 over tiles of 64: per chunk two diagonal partial tiles and one full tile.
  const BlockMap m = build_block_map(Mask::chunked_causal(128), 1, 512, 512, 64, 64);
  EXPECT_EQ(m.num_partial, 8);
  EXPECT_EQ(m.num_full, 4);
  EXPECT_EQ(m.num_empty, 64 - 12);
  EXPECT_EQ(m.num_unique_partial, 1);
  expect_matches_brute_force(Mask::chunked_causal(100), 1, 333, 333, 64, 48);
  expect_matches_brute_force(Mask::chunked_causal(7), 1, 50, 90, 8, 16);
}

TEST(BlockMap, FullMaskIsAllFullTiles) {
  const BlockMap m = build_block_map(Mask::full(), 4, 300, 200, 64, 64);
  EXPECT_EQ(m.num_full, 5 * 4);
  EXPECT_EQ(m.num_partial, 0);
  EXPECT_EQ(m.num_empty, 0);
  EXPECT_EQ(m.visible_pairs, 300.0 * 200.0);
}

TEST(BlockMap, PerHeadMasksGiveOneMapPerHead) {
  const Mask mask =
      Mask::per_head({Mask::causal(), Mask::full(), Mask::local(20, 5), Mask::chunked_causal(33)});
  const BlockMap m = build_block_map(mask, 4, 150, 150, 32, 32);
  EXPECT_EQ(m.heads, 4);
  EXPECT_EQ(m.row(1, 0).size(), 5u) << "head 1 is full: every kv block";
  EXPECT_EQ(m.row(0, 0).size(), 1u) << "head 0 is causal: the diagonal only";
  expect_matches_brute_force(mask, 4, 150, 150, 32, 32);
  expect_matches_brute_force(mask & Mask::causal(), 4, 70, 150, 16, 32);
}

TEST(BlockMap, PerHeadMaskWithWrongHeadCountIsShapeMismatch) {
  const Mask mask = Mask::per_head({Mask::causal(), Mask::full()});
  try {
    build_block_map(mask, 4, 10, 10, 8, 8);
    FAIL() << "expected shape_mismatch";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
    EXPECT_NE(std::string(e.what()).find("Hq=4"), std::string::npos) << e.what();
  }
}

TEST(BlockMap, AndOrCombinations) {
  expect_matches_brute_force(Mask::causal() & Mask::chunked_causal(50), 1, 200, 200, 32, 64);
  expect_matches_brute_force(Mask::local(10, 0) | Mask::chunked_causal(64), 1, 200, 260, 48, 40);
  expect_matches_brute_force(Mask::local(3, 3) | Mask::causal(), 1, 120, 120, 16, 16);
  expect_matches_brute_force((Mask::local(30, 0) & Mask::causal()) | Mask::local(0, 4), 1, 99, 99, 13, 11);
}

TEST(BlockMap, TqDifferentFromTkIsBottomRightAligned) {
  // Tq < Tk: a prefill continuing a cache; the last query sees every key.
  const BlockMap m = build_block_map(Mask::causal(), 1, 64, 256, 64, 64);
  EXPECT_EQ(m.num_full, 3);
  EXPECT_EQ(m.num_partial, 1);
  expect_matches_brute_force(Mask::causal(), 1, 100, 300, 32, 48);
  // Tq > Tk: the first Tq - Tk queries see nothing (fully masked rows).
  const BlockMap e = build_block_map(Mask::causal(), 1, 256, 64, 64, 64);
  EXPECT_EQ(e.row(0, 0).size(), 0u);
  EXPECT_EQ(e.row(0, 2).size(), 0u);
  EXPECT_EQ(e.row(0, 3).size(), 1u);
  expect_matches_brute_force(Mask::causal(), 1, 300, 100, 48, 32);
  expect_matches_brute_force(Mask::local(5, 40), 1, 300, 100, 17, 23);
}

TEST(BlockMap, OddBlockSizesAndTinyShapes) {
  expect_matches_brute_force(Mask::causal(), 1, 1, 1, 1, 1);
  expect_matches_brute_force(Mask::causal(), 1, 5, 0, 4, 4);  // no keys: every row empty
  expect_matches_brute_force(Mask::full(), 1, 0, 9, 4, 4);    // no queries
  expect_matches_brute_force(Mask::causal(), 1, 7, 5, 3, 2);
  expect_matches_brute_force(Mask::causal(), 1, 130, 130, 100, 70);  // bk > 64: two words per row
  expect_matches_brute_force(Mask::local(2, 1), 1, 65, 129, 65, 129);
}

TEST(BlockMap, InvalidSizesAreInvalidArgument) {
  for (auto [bq, bk] : {std::pair<std::int64_t, std::int64_t>{0, 8}, {8, 0}, {-1, 8}}) {
    try {
      build_block_map(Mask::causal(), 1, 16, 16, bq, bk);
      FAIL() << "expected invalid_argument";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
      EXPECT_NE(std::string(e.what()).find("blocksize"), std::string::npos) << e.what();
    }
  }
}

TEST(BlockMapCache, HitReturnsTheSamePointer) {
  clear_block_map_cache();
  const auto a = get_block_map(Mask::causal(), 8, 512, 512, 64, 64);
  const auto b = get_block_map(Mask::causal(), 8, 512, 512, 64, 64);
  EXPECT_EQ(a.get(), b.get());
  // A shared (head independent) map serves every Hq.
  EXPECT_EQ(get_block_map(Mask::causal(), 16, 512, 512, 64, 64).get(), a.get());
  // Any other key component gives another map.
  EXPECT_NE(get_block_map(Mask::causal(), 8, 512, 512, 64, 32).get(), a.get());
  EXPECT_NE(get_block_map(Mask::causal(), 8, 512, 511, 64, 64).get(), a.get());
  EXPECT_NE(get_block_map(Mask::local(4, 0), 8, 512, 512, 64, 64).get(), a.get());
  // Per-head masks key on Hq.
  const Mask ph = Mask::per_head({Mask::causal(), Mask::full()});
  EXPECT_EQ(get_block_map(ph, 2, 64, 64, 16, 16).get(), get_block_map(ph, 2, 64, 64, 16, 16).get());
}

TEST(BlockMapCache, IsBoundedAndEvictsLeastRecentlyUsed) {
  clear_block_map_cache();
  const auto first = get_block_map(Mask::causal(), 1, 100, 100, 16, 16);
  for (std::int64_t t = 1; t <= 40; ++t) get_block_map(Mask::causal(), 1, 100 + t, 100, 16, 16);
  // `first` is still alive (we hold it) but no longer cached: a new map is built.
  const auto again = get_block_map(Mask::causal(), 1, 100, 100, 16, 16);
  EXPECT_NE(first.get(), again.get());
  EXPECT_EQ(first->num_blocks(), again->num_blocks());
  // A recently used entry survives 15 newer ones.
  for (std::int64_t t = 1; t <= 15; ++t) get_block_map(Mask::causal(), 1, 200 + t, 100, 16, 16);
  EXPECT_EQ(get_block_map(Mask::causal(), 1, 100, 100, 16, 16).get(), again.get());
}

TEST(BlockMapCache, ConcurrentMissesAgreeOnOneMap) {
  // Threads that miss on the same key at once may each build a map, but all must get the one
  // that was cached first.
  clear_block_map_cache();
  constexpr int kThreads = 8;
  std::vector<const BlockMap*> got(kThreads, nullptr);
  std::vector<std::shared_ptr<const BlockMap>> keep(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &got, &keep] {
      keep[static_cast<std::size_t>(t)] = get_block_map(Mask::local(300, 0), 1, 3000, 3000, 32, 32);
      got[static_cast<std::size_t>(t)] = keep[static_cast<std::size_t>(t)].get();
    });
  for (auto& th : threads) th.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(got[static_cast<std::size_t>(t)], got[0]) << "thread " << t;
  EXPECT_EQ(get_block_map(Mask::local(300, 0), 1, 3000, 3000, 32, 32).get(), got[0]);
}

}  // namespace
}  // namespace attnops
