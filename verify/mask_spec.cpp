#include "verify/mask_spec.h"

#include <algorithm>

#include "verify/edges.h"

namespace attnops::verify {

Mask MaskSpec::build(std::int64_t Hq, std::int64_t Tq, std::int64_t Tk) const {
  switch (kind) {
    case Mask::Kind::causal:
      return Mask::causal();
    case Mask::Kind::local:
      return Mask::local(a, b);
    case Mask::Kind::chunked_causal:
      return Mask::chunked_causal(std::max<std::int64_t>(1, a));
    case Mask::Kind::per_head: {
      std::vector<Mask> heads;
      for (std::int64_t h = 0; h < Hq; ++h)
        heads.push_back(kids[static_cast<std::size_t>(h) % kids.size()].build(Hq, Tq, Tk));
      return Mask::per_head(std::move(heads));
    }
    case Mask::Kind::all_of:
      return kids[0].build(Hq, Tq, Tk) & kids[1].build(Hq, Tq, Tk);
    case Mask::Kind::any_of:
      return kids[0].build(Hq, Tq, Tk) | kids[1].build(Hq, Tq, Tk);
    case Mask::Kind::offset: {
      const std::int64_t oq = a + Tq + extra_q, ok = b + Tk + extra_k;
      return kids[0].build(Hq, oq, ok).at_offset(a, b, oq, ok);
    }
    default:
      return Mask::full();
  }
}

namespace {

MaskSpec draw_leaf(Rng& rng, std::int64_t Tk, bool allow_per_head) {
  MaskSpec m;
  const double u = rng.real();
  const ShapeContext ctx;
  if (u < 0.3) {
    m.kind = Mask::Kind::causal;
  } else if (u < 0.6) {
    m.kind = Mask::Kind::local;
    m.a = draw_size(rng, kSeqK, ctx, 0, std::max<std::int64_t>(0, Tk + 2));
    m.b = rng.chance(0.5) ? 0 : draw_size(rng, kSeqK, ctx, 0, std::max<std::int64_t>(0, Tk + 2));
  } else if (u < 0.8) {
    m.kind = Mask::Kind::chunked_causal;
    m.a = draw_size(rng, kSeqK, ctx, 1, std::max<std::int64_t>(1, Tk + 2));
  } else if (u < 0.9 || !allow_per_head) {
    m.kind = Mask::Kind::full;
  } else {
    m.kind = Mask::Kind::per_head;
    const std::int64_t n = rng.uniform(1, 3);
    for (std::int64_t i = 0; i < n; ++i) m.kids.push_back(draw_leaf(rng, Tk, false));
  }
  return m;
}

}  // namespace

MaskSpec draw_mask(Rng& rng, std::int64_t Tq, std::int64_t Tk) {
  MaskSpec m = draw_leaf(rng, Tk, true);
  if (rng.chance(0.4)) {
    MaskSpec both;
    both.kind = rng.chance(0.6) ? Mask::Kind::all_of : Mask::Kind::any_of;
    both.kids = {m, draw_leaf(rng, Tk, true)};
    m = both;
  }
  if (rng.chance(0.15)) {  // a block of a larger problem, as the ring's local calls see it
    MaskSpec off;
    off.kind = Mask::Kind::offset;
    off.a = rng.uniform(0, std::max<std::int64_t>(0, Tq));
    off.b = rng.uniform(0, std::max<std::int64_t>(0, Tk));
    off.extra_q = rng.chance(0.5) ? 0 : rng.uniform(0, std::max<std::int64_t>(0, Tq));
    off.extra_k = rng.chance(0.5) ? 0 : rng.uniform(0, std::max<std::int64_t>(0, Tk));
    off.kids = {m};
    m = off;
  }
  return m;
}

}  // namespace attnops::verify
