// ASan builds only (cmake/sanitizers.cmake compiles this into every in-tree program): keeps the
// Vulkan driver and layer that the tests use mapped until the process exits.
//
// The Vulkan loader dlclose()s lavapipe and the validation layer when the instance is destroyed,
// before LeakSanitizer runs at exit. Their own leaks (lavapipe's LLVM JIT state, the layer's
// caches) are then reported with "<unknown module>" frames that no suppression can name. Opening
// both once more with RTLD_NODELETE keeps them mapped, so tests/sanitizers/lsan.supp can name
// them by module and leak detection stays on for everything else. A missing library is ignored.
#include <dlfcn.h>

#include <initializer_list>

namespace {

const bool kVulkanLibrariesPinned = [] {
  for (const char* lib : {"libvulkan_lvp.so", "libVkLayer_khronos_validation.so"})
    dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  return true;
}();

}  // namespace
