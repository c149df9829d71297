// The Vulkan paged forward when the backend is not built (vulkan_stub.cpp's twin for vk_paged.h).
#include "attnops/error.h"
#include "attnops/ext/paged_problem.h"
#include "backends/vulkan/vk_paged.h"

namespace attnops::vulkan {

namespace {
constexpr const char* kWhy = "built without Vulkan (ATTNOPS_WITH_VULKAN=OFF or loader/glslc not found)";
}  // namespace

std::optional<Reason> check_paged_inputs(const PagedProblem&, const GpuSettings&) {
  return Reason{ReasonCode::backend_unavailable, kWhy};
}

void run_paged(const PagedProblem&, const GpuSettings&, PagedBuffers&) {
  throw Error(ErrorCode::backend_unavailable, kWhy);
}

}  // namespace attnops::vulkan
