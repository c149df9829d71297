// VkResult names, typed errors, environment switches and the object-creation counters.
#include "backends/vulkan/vk_util.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>

namespace attnops::vulkan::rt {

std::string result_name(VkResult r) {
  switch (r) {
#define ATTNOPS_VK_CASE(x) \
  case x:                  \
    return #x;
    ATTNOPS_VK_CASE(VK_SUCCESS)
    ATTNOPS_VK_CASE(VK_NOT_READY)
    ATTNOPS_VK_CASE(VK_TIMEOUT)
    ATTNOPS_VK_CASE(VK_INCOMPLETE)
    ATTNOPS_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    ATTNOPS_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    ATTNOPS_VK_CASE(VK_ERROR_INITIALIZATION_FAILED)
    ATTNOPS_VK_CASE(VK_ERROR_DEVICE_LOST)
    ATTNOPS_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    ATTNOPS_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    ATTNOPS_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    ATTNOPS_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    ATTNOPS_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    ATTNOPS_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    ATTNOPS_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    ATTNOPS_VK_CASE(VK_ERROR_FRAGMENTED_POOL)
    ATTNOPS_VK_CASE(VK_ERROR_UNKNOWN)
    ATTNOPS_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    ATTNOPS_VK_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    ATTNOPS_VK_CASE(VK_ERROR_FRAGMENTATION)
    ATTNOPS_VK_CASE(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
    ATTNOPS_VK_CASE(VK_PIPELINE_COMPILE_REQUIRED)
    ATTNOPS_VK_CASE(VK_ERROR_VALIDATION_FAILED_EXT)
#undef ATTNOPS_VK_CASE
    default:
      return "VkResult(" + std::to_string(static_cast<int>(r)) + ")";
  }
}

void throw_vk(VkResult r, const std::string& what) {
  std::string msg = "Vulkan: ";
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
    msg += r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "out of device memory: " : "out of host memory: ";
  throw Error(ErrorCode::gpu_error, msg + what + " failed (" + result_name(r) + ")");
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s == "1" || s == "true" || s == "on" || s == "yes";
}

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

namespace {
std::atomic<std::uint64_t> g_created[static_cast<int>(Created::count_)];
}  // namespace

void count_created(Created what, std::uint64_t n) {
  g_created[static_cast<int>(what)] += n;
}

std::uint64_t created(Created what) {
  return g_created[static_cast<int>(what)].load();
}

}  // namespace attnops::vulkan::rt
