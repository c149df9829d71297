// Environment of the Vulkan tests, set before main() and so before the process-wide Vulkan
// instance is created: lavapipe is allowed and every call runs under the validation layer with
// synchronization validation. A value already in the environment wins (e.g. to test a real GPU
// without validation: ATTNOPS_VK_VALIDATION=0 ./test_vulkan).
#include <cstdlib>

namespace {
const bool kEnvironmentSet = [] {
  setenv("ATTNOPS_VK_ALLOW_SOFTWARE", "1", 0);
  setenv("ATTNOPS_VK_VALIDATION", "1", 0);
  // lavapipe compiles a pipeline with LLVM when it first runs it, inside the fence wait: seconds
  // to tens of seconds per shader on a loaded 2-core machine, so the tests wait longer than the
  // default 2 minutes before calling a submission lost.
  setenv("ATTNOPS_VK_TIMEOUT_MS", "900000", 0);
  return true;
}();
}  // namespace
