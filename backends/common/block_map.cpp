// Building and caching block maps (see block_map_impl.h for what a map holds).
//
// Classification is exact: for each query row the mask gives its visible columns as an interval
// (Mask::row_interval, O(1) per row) whenever it can, so a tile's visible count is a sum of
// interval overlaps and only partial tiles have bits materialised. Rows that are not intervals
// (an | of disjoint parts) fall back to Mask::visible per element, once per row.
#include <algorithm>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "attnops/error.h"
#include "backends/common/block_map_impl.h"

namespace attnops {
namespace {

// The visible columns of one query row: an interval [lo, hi), or explicit bits over [0, Tk).
struct RowVis {
  bool is_interval = true;
  std::int64_t lo = 0, hi = 0;
  std::vector<std::uint64_t> bits;  // when !is_interval: Tk bits

  std::int64_t count(std::int64_t c0, std::int64_t c1) const {
    if (is_interval) return std::max<std::int64_t>(0, std::min(hi, c1) - std::max(lo, c0));
    std::int64_t n = 0;
    for (std::int64_t c = c0; c < c1; ++c) n += (bits[static_cast<std::size_t>(c >> 6)] >> (c & 63)) & 1u;
    return n;
  }
  bool test(std::int64_t c) const {
    if (is_interval) return c >= lo && c < hi;
    return (bits[static_cast<std::size_t>(c >> 6)] >> (c & 63)) & 1u;
  }
};

std::uint64_t hash_words(const std::uint64_t* w, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over words, then mixed
  for (std::size_t i = 0; i < n; ++i) {
    h ^= w[i];
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  return h;
}

// Stores partial bitsets, deduplicated by content.
class PartialStore {
 public:
  explicit PartialStore(std::size_t words_per_tile) : words_(words_per_tile) {}
  // Returns the index of `tile` (words_ words) and whether it is new (then it was appended).
  std::pair<std::int32_t, bool> intern(const std::vector<std::uint64_t>& tile,
                                       std::vector<std::uint64_t>& bits) {
    const std::uint64_t h = hash_words(tile.data(), words_);
    auto& bucket = index_[h];
    for (std::int32_t idx : bucket) {
      if (std::equal(tile.begin(), tile.end(), bits.begin() + static_cast<std::ptrdiff_t>(idx * words_)))
        return {idx, false};
    }
    const auto idx = static_cast<std::int32_t>(bits.size() / words_);
    bits.insert(bits.end(), tile.begin(), tile.end());
    bucket.push_back(idx);
    return {idx, true};
  }

 private:
  std::size_t words_;
  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> index_;
};

}  // namespace

BlockMap build_block_map(const Mask& mask, std::int64_t Hq, std::int64_t Tq, std::int64_t Tk, std::int64_t bq,
                         std::int64_t bk) {
  auto positive = [](const char* name, std::int64_t v) {
    if (v < 1)
      throw Error(ErrorCode::invalid_argument,
                  std::string("block map: ") + name + " must be >= 1, got " + std::to_string(v));
  };
  positive("Hq", Hq);
  // Tq = 0 (nothing to compute) and Tk = 0 (every row fully masked) are valid, empty maps.
  for (auto [name, v] : {std::pair{"Tq", Tq}, std::pair{"Tk", Tk}})
    if (v < 0)
      throw Error(ErrorCode::invalid_argument,
                  std::string("block map: ") + name + " must be >= 0, got " + std::to_string(v));
  positive("blocksize_q", bq);
  positive("blocksize_k", bk);
  const bool per_head = mask.head_dependent();
  if (per_head && mask.num_heads() != Hq)
    throw Error(ErrorCode::shape_mismatch, "block map: mask is per_head with " +
                                               std::to_string(mask.num_heads()) +
                                               " heads, expected Hq=" + std::to_string(Hq));

  BlockMap m;
  m.Tq = Tq;
  m.Tk = Tk;
  m.bq = bq;
  m.bk = bk;
  m.nq = (Tq + bq - 1) / bq;
  m.nk = (Tk + bk - 1) / bk;
  m.heads = per_head ? Hq : 1;
  m.words_per_row = (bk + 63) / 64;
  m.words_per_col = (bq + 63) / 64;
  m.row_start.reserve(static_cast<std::size_t>(m.heads * m.nq + 1));
  m.row_start.push_back(0);

  const auto wpr = static_cast<std::size_t>(m.words_per_row);
  PartialStore store(static_cast<std::size_t>(bq) * wpr);
  std::vector<std::uint64_t> tile(static_cast<std::size_t>(bq) * wpr);
  std::vector<RowVis> rows(static_cast<std::size_t>(bq));

  for (std::int64_t hh = 0; hh < m.heads; ++hh) {
    for (std::int64_t qb = 0; qb < m.nq; ++qb) {
      const std::int64_t i0 = qb * bq, nr = std::min(bq, Tq - i0);
      // Visible columns of every row of the q block, and the column span they touch.
      std::int64_t span_lo = Tk, span_hi = 0;
      for (std::int64_t r = 0; r < nr; ++r) {
        RowVis& rv = rows[static_cast<std::size_t>(r)];
        const auto iv = mask.row_interval(hh, i0 + r, Tq, Tk);
        if (iv) {
          rv.is_interval = true;
          rv.lo = std::max<std::int64_t>(iv->first, 0);
          rv.hi = std::min(iv->second, Tk);
          if (rv.lo < rv.hi) {
            span_lo = std::min(span_lo, rv.lo);
            span_hi = std::max(span_hi, rv.hi);
          }
        } else {
          rv.is_interval = false;
          rv.bits.assign(static_cast<std::size_t>((Tk + 63) / 64), 0);
          for (std::int64_t j = 0; j < Tk; ++j) {
            if (mask.visible(hh, i0 + r, j, Tq, Tk)) {
              rv.bits[static_cast<std::size_t>(j >> 6)] |= std::uint64_t{1} << (j & 63);
              span_lo = std::min(span_lo, j);
              span_hi = std::max(span_hi, j + 1);
            }
          }
        }
      }
      std::int64_t kb_lo = 0, kb_hi = 0;  // candidate kv blocks; all others are empty
      if (span_lo < span_hi) {
        kb_lo = span_lo / bk;
        kb_hi = (span_hi - 1) / bk + 1;
      }
      m.num_empty += m.nk - (kb_hi - kb_lo);
      for (std::int64_t kb = kb_lo; kb < kb_hi; ++kb) {
        const std::int64_t c0 = kb * bk, c1 = std::min(c0 + bk, Tk);
        std::int64_t visible = 0;
        for (std::int64_t r = 0; r < nr; ++r) visible += rows[static_cast<std::size_t>(r)].count(c0, c1);
        if (visible == 0) {
          ++m.num_empty;
          continue;
        }
        m.visible_pairs += static_cast<double>(visible);
        BlockMap::Block blk;
        blk.kv = static_cast<std::int32_t>(kb);
        if (visible == nr * (c1 - c0)) {
          ++m.num_full;
        } else {
          ++m.num_partial;
          std::fill(tile.begin(), tile.end(), 0);
          for (std::int64_t r = 0; r < nr; ++r) {
            const RowVis& rv = rows[static_cast<std::size_t>(r)];
            std::uint64_t* dst = tile.data() + static_cast<std::size_t>(r) * wpr;
            for (std::int64_t c = c0; c < c1; ++c)
              if (rv.test(c)) dst[(c - c0) >> 6] |= std::uint64_t{1} << ((c - c0) & 63);
          }
          const auto [idx, is_new] = store.intern(tile, m.bits);
          blk.partial = idx;
          if (is_new) {  // append the transposed copy of the new bitset
            const std::size_t base = m.bits_t.size();
            m.bits_t.resize(base + static_cast<std::size_t>(bk * m.words_per_col), 0);
            for (std::int64_t r = 0; r < nr; ++r)
              for (std::int64_t c = 0; c < c1 - c0; ++c)
                if ((tile[static_cast<std::size_t>(r) * wpr + static_cast<std::size_t>(c >> 6)] >> (c & 63)) &
                    1u)
                  m.bits_t[base + static_cast<std::size_t>(c * m.words_per_col + (r >> 6))] |=
                      std::uint64_t{1} << (r & 63);
          }
        }
        m.blocks.push_back(blk);
      }
      m.row_start.push_back(static_cast<std::int64_t>(m.blocks.size()));
    }
  }
  m.num_unique_partial = static_cast<std::int64_t>(m.bits.size() / (static_cast<std::size_t>(bq) * wpr));
  return m;
}

namespace {

// A bounded LRU of built maps. Maps are immutable once built and shared by pointer, so a map
// evicted while a kernel still uses it stays alive until that kernel drops its pointer.
class BlockMapCache {
 public:
  static constexpr std::size_t kCapacity = 16;

  std::shared_ptr<const BlockMap> get(const Mask& mask, std::int64_t Hq, std::int64_t Tq, std::int64_t Tk,
                                      std::int64_t bq, std::int64_t bk) {
    // Hq is part of the key only for head dependent masks: a shared map serves every Hq.
    const std::string key = mask.key() + "|" + std::to_string(mask.head_dependent() ? Hq : 0) + "|" +
                            std::to_string(Tq) + "|" + std::to_string(Tk) + "|" + std::to_string(bq) + "|" +
                            std::to_string(bk);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto hit = find_locked(key)) return hit;
    }
    // Build outside the lock (a long map must not stall other shapes); if another thread
    // built the same map meanwhile, keep the first one so equal keys give equal pointers.
    auto built = std::make_shared<const BlockMap>(build_block_map(mask, Hq, Tq, Tk, bq, bk));
    std::lock_guard<std::mutex> lock(mu_);
    if (auto hit = find_locked(key)) return hit;
    lru_.emplace_front(key, built);
    index_[key] = lru_.begin();
    while (lru_.size() > kCapacity) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return built;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    index_.clear();
    lru_.clear();
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const BlockMap>>;
  std::shared_ptr<const BlockMap> find_locked(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);  // most recently used first
    return it->second->second;
  }
  std::mutex mu_;
  std::list<Entry> lru_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

BlockMapCache& cache() {
  static BlockMapCache c;
  return c;
}

}  // namespace

std::shared_ptr<const BlockMap> get_block_map(const Mask& mask, std::int64_t Hq, std::int64_t Tq,
                                              std::int64_t Tk, std::int64_t bq, std::int64_t bk) {
  return cache().get(mask, Hq, Tq, Tk, bq, bk);
}

void clear_block_map_cache() {
  cache().clear();
}

}  // namespace attnops
