// What the shaders need to know about the static mask of one problem (host side, no Vulkan):
// the block map flattened into GPU arrays, and, when the mask is a conjunction of causal,
// local and chunked-causal parts, the parameters with which partial tiles evaluate it in the
// shader instead of reading a bitset. Buffer layouts: see shaders/attn_io.glsl.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "attnops/mask.h"
#include "backends/common/block_map_impl.h"

namespace attnops::vulkan {

// The tile of flash_rowwise (flash.comp): BQ rows per workgroup (one invocation per row), BK
// keys per kv tile (a visibility bitmask of one uint per tile row, hence BK <= 32). The tiled
// kernels choose theirs per device (vk_kernel_select.h), also with at most 32 keys.
inline constexpr std::int64_t kBlockQ = 32;
inline constexpr std::int64_t kBlockK = 32;
static_assert(kBlockK <= 32, "the shaders keep one visibility bit per key of a tile in a uint");

// A static mask the shader evaluates itself: j in [lo(p), hi(p)) with p = i + Tk - Tq.
struct ParamMask {
  bool causal = false;
  std::int64_t left = -1, right = -1;  // window bounds; -1 = unbounded on that side
  std::int64_t chunk = 0;              // chunked causal when > 0
};
// The parameters of `mask` when it is an AND (any nesting) of full / causal / local /
// chunked_causal parts (a per_head node whose heads are all equal counts as that mask);
// nullopt otherwise (| of masks, different per-head masks, two different chunk sizes, an
// at_offset block).
std::optional<ParamMask> param_mask(const Mask& mask);

struct TilePlan {
  std::shared_ptr<const BlockMap> map;   // keeps the map alive while its arrays are uploaded
  std::vector<std::uint32_t> row_start;  // [heads * nq + 1]
  std::vector<std::uint32_t> entries;    // kv block << 1 | full
  std::vector<std::int32_t> part_index;  // bitset index per entry (-1 when full)
  std::optional<ParamMask> param;        // set: partial tiles evaluate these, not the bitsets
};

// Flattens `map` (whose kv tile must be at most 32 keys).
TilePlan make_tile_plan(const Mask& mask, std::shared_ptr<const BlockMap> map);

}  // namespace attnops::vulkan
