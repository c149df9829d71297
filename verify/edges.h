// The sizes at which some kernel changes what it does (a tile ends, a task splits, a path is
// chosen), collected from the kernels in one table, so that the generator draws values just
// below, at and above each of them far more often than a uniform draw would. A bug such as a
// per-thread scratch that a narrow tail task leaves stale for the next wide one lives exactly
// there: at a chunk's tail, past a key block, with more tasks than threads.
//
// When a kernel constant changes, change it here too (the comment of each entry names its
// source); tests/verify checks that every entry +-1 is reached.
#pragma once

#include <cstdint>
#include <vector>

#include "verify/rng.h"

namespace attnops::verify {

// What a size measures. One entry may apply to several axes (a bit set of them).
enum Axis : unsigned {
  kSeqQ = 1u << 0,     // Tq, a paged sequence's q_len
  kSeqK = 1u << 1,     // Tk, a paged sequence's kv_len
  kHeadDim = 1u << 2,  // D, Dv
  kBlock = 1u << 3,    // blocksize_q / blocksize_k of the tiled operators
  kPage = 1u << 4,     // page_size of a paged cache
  kSplit = 1u << 5,    // kv_split_tokens of a paged call
  kKv8 = 1u << 6,      // D, Dv and a decode's kv_len over an 8-bit cache
};

struct Edge {
  const char* name;
  std::int64_t value;
  unsigned axes;
  const char* source;  // where the kernel defines it
};

// The static table (kernel constants).
const std::vector<Edge>& edge_table();

// Sizes that depend on the problem: vanilla's q chunk 128 / G (G = Hq / Hkv, at least 16
// rows), decode's 2 MiB of K/V per thread as keys (Hkv, D + Dv, element size), the smallest
// call that gets a second thread (2 MFLOP per thread).
struct ShapeContext {
  std::int64_t group = 1;  // Hq / Hkv
  std::int64_t Hq = 1, Hkv = 1, D = 64, Dv = 64, B = 1, elem_bytes = 4;
};
std::vector<Edge> dynamic_edges(unsigned axis, const ShapeContext& ctx);

// Every edge value of `axis` (static and dynamic), each with its neighbours -1 and +1 and its
// doubles, clipped to [lo, hi]; sorted, unique. The values draw_size favours.
std::vector<std::int64_t> edge_values(unsigned axis, const ShapeContext& ctx, std::int64_t lo,
                                      std::int64_t hi);

// A size in [lo, hi] for `axis`: usually an edge (or a small multiple of one) plus -1, 0 or +1,
// otherwise log-uniform over the range, so every octave of sizes gets its share.
std::int64_t draw_size(Rng& rng, unsigned axis, const ShapeContext& ctx, std::int64_t lo, std::int64_t hi);

}  // namespace attnops::verify
