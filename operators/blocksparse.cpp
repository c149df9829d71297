#include "operators/blocksparse.h"

namespace attnops {

OperationMetadata BlockSparseAttn::default_metadata() {
  OperationMetadata md;
  md.fallbacks.decode = true;
  md.fallbacks.non_causal = true;
  md.fallbacks.seq_multiple = true;
  md.blocksize_q = 128;
  md.blocksize_k = 128;
  return md;
}

}  // namespace attnops
