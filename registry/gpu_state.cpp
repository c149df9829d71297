// release_gpu(): the process's GPU state is owned here, above the backends, and released by
// the programs (CLI, tests, benches, the example) before they return.
#include "attnops/gpu.h"
#include "backends/vulkan/vulkan_backend.h"

namespace attnops {

void release_gpu() {
  vulkan::release();
}

}  // namespace attnops
