// Environment of the Vulkan tests, set before main() and so before the process-wide Vulkan
// instance is created: lavapipe is allowed and every call runs under the validation layer with
// synchronization validation. A value already in the environment wins (e.g. to test a real GPU
// without validation: ATTNOPS_VK_VALIDATION=0 ./test_vulkan).
#include <cstdlib>

namespace {
const bool kEnvironmentSet = [] {
  setenv("ATTNOPS_VK_ALLOW_SOFTWARE", "1", 0);
  setenv("ATTNOPS_VK_VALIDATION", "1", 0);
  return true;
}();
}  // namespace
