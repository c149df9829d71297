// A program that uses the GPU and returns from main, run as a subprocess by test_vulkan
// (VulkanExit): "release" calls attnops::release_gpu() first, "leave" leaves the GPU state (and a
// device tensor in a static) to the OS. Either way the process must exit 0: no Vulkan call may
// run from exit(). Prints what ran.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "attnops/attnops.h"

namespace {
attnops::DeviceTensor g_kept;  // destroyed during exit in "leave" mode
}  // namespace

int main(int argc, char** argv) {
  const bool release = argc > 1 && std::strcmp(argv[1], "release") == 0;
  setenv("ATTNOPS_VK_ALLOW_SOFTWARE", "1", 0);
  try {
    attnops::Config cfg;
    cfg.backends = std::vector<attnops::Backend>{attnops::Backend::gpu};
    const attnops::Attention attn = attnops::registry().get("flash_attn2", cfg);
    attnops::Tensor q(attnops::DType::f32, {1, 16, 2, 32}), k(attnops::DType::f32, {1, 16, 2, 32}),
        v(attnops::DType::f32, {1, 16, 2, 32});
    for (std::size_t i = 0; i < 1024; ++i) {
      q.set(i, 0.01f * static_cast<float>(i % 13));
      k.set(i, 0.02f * static_cast<float>(i % 7));
      v.set(i, 1.f);
    }
    g_kept = attnops::to_device(k);
    const attnops::AttentionOutput out = attn(q, g_kept, v);
    std::printf("ran on %s: %s\n", std::string(attnops::backend_name(out.decision.backend)).c_str(),
                out.decision.to_json().c_str());
  } catch (const attnops::Error& e) {
    std::printf("no gpu: %s\n", e.what());  // still a clean exit
  }
  if (release) attnops::release_gpu();
  return 0;
}
