// The package test's consumer: includes the installed header, gets flash_attn2 from the registry
// and runs one small call.
#include <attnops/attnops.h>

#include <cstdio>
#include <vector>

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
  attnops::release_gpu();
  return status;
}
