// A drawn attnops::Mask as data: a small tree that can be rebuilt for other head counts and
// sequence lengths (the shrinker halves Hq, Tq and Tk of a failing case and keeps its mask).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnops/mask.h"
#include "verify/rng.h"

namespace attnops::verify {

struct MaskSpec {
  Mask::Kind kind = Mask::Kind::full;
  std::int64_t a = 0, b = 0;  // local: (left, right); chunked_causal: a; offset: (q0, k0)
  std::int64_t extra_q = 0,
               extra_k = 0;    // offset: the outer problem is (q0 + Tq + extra_q, k0 + Tk + extra_k)
  std::vector<MaskSpec> kids;  // all_of / any_of: 2; per_head: cycled over the q heads; offset: 1

  // The mask for a call with Hq q heads and (Tq, Tk) positions.
  Mask build(std::int64_t Hq, std::int64_t Tq, std::int64_t Tk) const;
};

// A random mask: a leaf (causal, local, chunked, full, per_head), sometimes two combined with &
// or |, sometimes seen at an offset of a larger problem; window and chunk sizes drawn near the
// kernels' edges (edges.h) for keys up to `Tk`.
MaskSpec draw_mask(Rng& rng, std::int64_t Tq, std::int64_t Tk);

}  // namespace attnops::verify
