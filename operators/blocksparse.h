// BlockSparseAttn (name "blocksparse", alias "splash"): Splash attention. The static mask is
// reduced to a block map; empty blocks are skipped, full blocks run unmasked, partial blocks
// masked. Default fallbacks to vanilla: decode (q_len == 1), non_causal, seq_multiple
// (q_len % 128 != 0), each switchable in YAML; with one switched off, the kernel handles the case.
#pragma once

#include "operators/tiled_operator.h"

namespace attnops {

class BlockSparseAttn : public TiledOperator {
 public:
  using TiledOperator::TiledOperator;
  static OperationMetadata default_metadata();

  std::string name() const override { return "blocksparse"; }
  std::vector<std::string> aliases() const override { return {"splash"}; }

 protected:
  vulkan::Kernel gpu_kernel() const override { return vulkan::Kernel::blocksparse; }
};

}  // namespace attnops
