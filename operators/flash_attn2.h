// FlashAttn2 (name "flash_attn2", alias "flash"): tiled online-softmax attention
// (FlashAttention-2 order: q blocks outside, kv blocks inside, one division at the end), with
// additive bias; masked blocks are skipped through the same block map as blocksparse. Default
// fallback to vanilla: decode (q_len == 1) only.
#pragma once

#include "operators/tiled_operator.h"

namespace attnops {

class FlashAttn2 : public TiledOperator {
 public:
  using TiledOperator::TiledOperator;
  static OperationMetadata default_metadata();

  std::string name() const override { return "flash_attn2"; }
  std::vector<std::string> aliases() const override { return {"flash"}; }

 protected:
  vulkan::Kernel gpu_kernel() const override { return vulkan::Kernel::flash; }
};

}  // namespace attnops
