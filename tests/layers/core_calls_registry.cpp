// Not part of any build: the layer check's probe (tests/layers/CMakeLists.txt). Core code that
// calls the registry, a layer above it; linking it as core must fail with an undefined reference.
#include "attnops/registry.h"

namespace attnops {

int layer_probe_operator_count() {
  return static_cast<int>(registry().list().size());
}

}  // namespace attnops
