#include "backends/vulkan/vk_tile_plan.h"

#include <algorithm>
#include <string>

#include "attnops/error.h"

namespace attnops::vulkan {

namespace {

// Folds `m` into `acc` (an AND); false when `m` cannot be expressed as a ParamMask.
bool fold(const Mask& m, ParamMask& acc) {
  switch (m.kind()) {
    case Mask::Kind::full:
      return true;
    case Mask::Kind::causal:
      acc.causal = true;
      return true;
    case Mask::Kind::local:
      // local(L1, R1) & local(L2, R2) = local(min L, min R).
      acc.left = acc.left < 0 ? m.left() : std::min(acc.left, m.left());
      acc.right = acc.right < 0 ? m.right() : std::min(acc.right, m.right());
      return true;
    case Mask::Kind::chunked_causal:
      if (acc.chunk > 0 && acc.chunk != m.chunk()) return false;
      acc.chunk = m.chunk();
      return true;
    case Mask::Kind::all_of:
      for (const Mask& c : m.children())
        if (!fold(c, acc)) return false;
      return true;
    case Mask::Kind::per_head: {
      const auto& heads = m.children();
      if (heads.empty()) return true;
      for (const Mask& c : heads)
        if (c.key() != heads.front().key()) return false;
      return fold(heads.front(), acc);
    }
    case Mask::Kind::any_of:
    case Mask::Kind::offset:  // positions relative to an outer problem: partial tiles read bitsets
      return false;
  }
  return false;
}

}  // namespace

std::optional<ParamMask> param_mask(const Mask& mask) {
  ParamMask pm;
  if (!fold(mask, pm)) return std::nullopt;
  return pm;
}

TilePlan make_tile_plan(const Mask& mask, std::shared_ptr<const BlockMap> map) {
  if (!map || map->bk > 32)
    throw Error(ErrorCode::internal, "vulkan: the block map's kv tile must be at most 32 keys");
  TilePlan plan;
  plan.row_start.reserve(map->row_start.size());
  for (std::int64_t s : map->row_start) plan.row_start.push_back(static_cast<std::uint32_t>(s));
  plan.entries.reserve(map->blocks.size());
  plan.part_index.reserve(map->blocks.size());
  for (const BlockMap::Block& b : map->blocks) {
    plan.entries.push_back((static_cast<std::uint32_t>(b.kv) << 1) | (b.is_full() ? 1u : 0u));
    plan.part_index.push_back(b.partial);
  }
  plan.param = param_mask(mask);
  plan.map = std::move(map);
  return plan;
}

}  // namespace attnops::vulkan
