#include "operators/vanilla.h"

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/vanilla_cpu.h"
#include "backends/native/reference.h"
#include "backends/vulkan/vulkan_backend.h"
#include "operators/backward_glue.h"
#include "operators/forward_glue.h"

namespace attnops {

OperationMetadata VanillaAttn::default_metadata() {
  return OperationMetadata{};
}

std::optional<Reason> VanillaAttn::check_inputs(Backend b, const AttentionProblem& p) const {
  if (b == Backend::gpu) return vulkan::check_inputs(vulkan::Kernel::vanilla, p, metadata().gpu);
  return std::nullopt;
}

AttentionOutput VanillaAttn::forward_native(const AttentionProblem& p) {
  return run_forward(
      p, [](const AttentionProblem& q, AttentionBuffers& b) { native::reference_attention(q, b); });
}

AttentionOutput VanillaAttn::forward_cpu(const AttentionProblem& p) {
  return run_forward(p, [](const AttentionProblem& q, AttentionBuffers& b) { cpu::vanilla_attention(q, b); });
}

AttentionOutput VanillaAttn::forward_gpu(const AttentionProblem& p) {
  return run_forward(p, [this](const AttentionProblem& q, AttentionBuffers& b) {
    vulkan::run(vulkan::Kernel::vanilla, q, nullptr, metadata().gpu, b);
  });
}

AttentionGradients VanillaAttn::backward_native(const BackwardProblem& p) {
  return native_backward(p);
}

AttentionGradients VanillaAttn::backward_cpu(const BackwardProblem& p) {
  return cpu_backward(p);
}

AttentionGradients VanillaAttn::backward_gpu(const BackwardProblem& p) {
  return gpu_backward(p, metadata().gpu);
}

std::optional<Reason> VanillaAttn::check_backward_inputs(Backend b, const BackwardProblem& p) const {
  return check_shared_backward(b, p, metadata().gpu);
}

}  // namespace attnops
