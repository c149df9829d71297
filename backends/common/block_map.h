// Block map (Splash's MaskInfo, FlexAttention's BlockMask): the static mask reduced to
// (q block, kv block) tiles, each empty (skipped), full (no mask evaluated) or partial (masked).
// This header fixes the entry points the operators use.
#pragma once

#include <cstdint>
#include <memory>

#include "attnops/mask.h"

namespace attnops {

struct BlockMap;  // defined in block_map_impl.h by the tiled-kernels work

// The block map for (mask, Hq, Tq, Tk, bq, bk), built once and cached (thread-safe, bounded).
std::shared_ptr<const BlockMap> get_block_map(const Mask& mask, std::int64_t Hq, std::int64_t Tq,
                                              std::int64_t Tk, std::int64_t bq, std::int64_t bk);

}  // namespace attnops
