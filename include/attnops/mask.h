// Static attention masks as combinable objects (as JAX Splash's CausalMask / LocalMask /
// ChunkedCausalMask / MultiHeadMask and their & / |).
//
// A mask says whether query row i of q head h may see key column j, for given (Tq, Tk). Rows are
// aligned bottom-right: query i sits at absolute position p = i + (Tk - Tq), so with Tq < Tk (a
// prefill continuing a cache) the last query sees every key. Definitions, exactly:
//   full                 every j
//   causal               j <= p
//   local(L, R)          p - L <= j <= p + R
//   chunked_causal(C)    j <= p  and  floor(j / C) == floor(p / C)
//   per_head(m_0..m_H-1) q head h uses m_h
//   a & b, a | b         logical and / or
//   m.at_offset(q0, k0, Tq', Tk')
//                        row i, column j is row q0 + i, column k0 + j of m over a (Tq', Tk')
//                        problem; positions outside [0, Tq') x [0, Tk') are masked
// at_offset makes a block of a larger problem a call of its own with the larger problem's mask:
// sequence-parallel attention (distributed/) runs one local call per pair of a rank's query
// chunk and a visiting key chunk, and its masks (causal, windows, chunks) hold on global
// positions, which no bottom-right aligned mask of the block's own (Tq, Tk) can express.
// Segment ids are data, not part of a static mask: kernels AND them in (seg_q[i] == seg_kv[j]).
// Masks are immutable values, cheap to copy (shared nodes), usable from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnops {

class Mask {
 public:
  enum class Kind { full, causal, local, chunked_causal, per_head, all_of, any_of, offset };

  static Mask full();
  static Mask causal();
  static Mask local(std::int64_t left, std::int64_t right);  // both >= 0
  static Mask chunked_causal(std::int64_t chunk);            // chunk >= 1
  static Mask per_head(std::vector<Mask> heads);             // one mask per q head
  Mask operator&(const Mask& other) const;
  Mask operator|(const Mask& other) const;
  // This mask seen from the block of a (Tq, Tk) problem whose rows start at q_offset and columns
  // at k_offset (all >= 0): visible(h, i, j, *, *) = visible(h, q_offset + i, k_offset + j, Tq, Tk),
  // false outside [0, Tq) x [0, Tk). The block's own (Tq, Tk) then play no part.
  Mask at_offset(std::int64_t q_offset, std::int64_t k_offset, std::int64_t Tq, std::int64_t Tk) const;

  Mask();  // full
  Kind kind() const;
  std::int64_t left() const;   // local
  std::int64_t right() const;  // local
  std::int64_t chunk() const;  // chunked_causal
  // offset: the block's origin and the outer problem's size; children() holds the outer mask.
  std::int64_t q_offset() const;
  std::int64_t k_offset() const;
  std::int64_t outer_tq() const;
  std::int64_t outer_tk() const;
  const std::vector<Mask>& children() const;  // per_head (one per head), all_of, any_of, offset (one)

  // Whether (h, i, j) is visible. h is the q head (ignored unless per_head is involved).
  bool visible(std::int64_t h, std::int64_t i, std::int64_t j, std::int64_t Tq, std::int64_t Tk) const;

  // The visible columns of row i as a half-open range [lo, hi) clipped to [0, Tk), when the row
  // is exactly an interval (always for full/causal/local/chunked and their &; for | only when
  // the parts overlap or touch). nullopt means "not an interval: evaluate visible() per column".
  // An empty row gives lo >= hi.
  std::optional<std::pair<std::int64_t, std::int64_t>> row_interval(std::int64_t h, std::int64_t i,
                                                                    std::int64_t Tq, std::int64_t Tk) const;

  // True when some per_head node makes the mask differ between heads.
  bool head_dependent() const;
  // Number of heads a per_head mask was built for (0 when not head dependent).
  std::int64_t num_heads() const;
  // A canonical text form, e.g. "causal&local(32,0)"; equal strings mean equal masks. Used as a
  // cache key for block maps and in decisions.
  const std::string& key() const;

 private:
  struct Node;
  explicit Mask(std::shared_ptr<const Node> n);
  static Mask combine(Kind kind, const Mask& a, const Mask& b);
  std::shared_ptr<const Node> node_;
};

}  // namespace attnops
