#include "operators/flash_attn2.h"

namespace attnops {

OperationMetadata FlashAttn2::default_metadata() {
  OperationMetadata md;
  md.fallbacks.decode = true;
  md.blocksize_q = 128;
  md.blocksize_k = 128;
  return md;
}

}  // namespace attnops
