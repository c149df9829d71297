// The package test's consumer: includes the installed header, gets flash_attn2 from the registry
// and runs one small call.
#include <attnops/attnops.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(ATTNOPS_CONSUMER_CHECK_DRIVER_MAPPED)
#include <link.h>

// Whether lavapipe (the Vulkan driver the loader opens here) is mapped in this process.
bool vulkan_driver_mapped() {
  return dl_iterate_phdr(
             [](dl_phdr_info* info, std::size_t, void*) {
               const char* name = info->dlpi_name ? std::strrchr(info->dlpi_name, '/') : nullptr;
               return name && std::strcmp(name, "/libvulkan_lvp.so") == 0 ? 1 : 0;
             },
             nullptr) != 0;
}
#endif

int run_consumer() {
  const attnops::Attention attn = attnops::registry().get("flash_attn2");
  attnops::Tensor q(attnops::DType::f32, {1, 4, 2, 8}), k(attnops::DType::f32, {1, 4, 2, 8}),
      v(attnops::DType::f32, {1, 4, 2, 8});
  for (std::size_t i = 0; i < 64; ++i) {
    q.set(i, 0.01f * static_cast<float>(i));
    k.set(i, 0.02f * static_cast<float>(i % 7));
    v.set(i, 1.0f);
  }
  const attnops::AttentionOutput out = attn(q, k, v);
  // Every value of v is 1, so every output is 1 (a convex combination of ones).
  for (std::size_t i = 0; i < 64; ++i)
    if (out.attention_outputs.at(i) < 0.999f || out.attention_outputs.at(i) > 1.001f) {
      std::printf("consumer: wrong output %f at %zu\n", out.attention_outputs.at(i), i);
      return 1;
    }
  std::printf("consumer: %s ran as %s on %s\n", attn.name().c_str(), out.decision.op.c_str(),
              std::string(attnops::backend_name(out.decision.backend)).c_str());
  return 0;
}

// The GPU state is released before main returns (never from a static destructor: gpu.h).
int main() {
  const int status = run_consumer();
#if defined(ATTNOPS_CONSUMER_CHECK_DRIVER_MAPPED)
  // ASan build: a driver the loader opened must stay mapped until exit (keep_vulkan_loaded.cpp),
  // or LeakSanitizer reports its leaks as "<unknown module>", which no suppression can name.
  const bool mapped_during = vulkan_driver_mapped();
  attnops::release_gpu();
  if (mapped_during && !vulkan_driver_mapped()) {
    std::printf("consumer: the Vulkan driver was unloaded before exit (keep_vulkan_loaded.cpp missing)\n");
    return 1;
  }
#else
  attnops::release_gpu();
#endif
  return status;
}
