#include "operators/tiled_operator.h"

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map.h"
#include "backends/cpu/tiled_cpu.h"
#include "backends/native/tiled_native.h"
#include "operators/backward_glue.h"
#include "operators/forward_glue.h"

namespace attnops {

namespace {
std::shared_ptr<const BlockMap> block_map_for(const AttentionProblem& p) {
  return get_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k);
}
}  // namespace

std::optional<Reason> TiledOperator::check_inputs(Backend b, const AttentionProblem& p) const {
  if (b == Backend::gpu) return vulkan::check_inputs(gpu_kernel(), p, metadata().gpu);
  return std::nullopt;
}

AttentionOutput TiledOperator::forward_native(const AttentionProblem& p) {
  return run_forward(p, [](const AttentionProblem& q, AttentionBuffers& b) {
    native::tiled_attention(q, *block_map_for(q), b);
  });
}

AttentionOutput TiledOperator::forward_cpu(const AttentionProblem& p) {
  return run_forward(p, [](const AttentionProblem& q, AttentionBuffers& b) {
    cpu::tiled_attention(q, *block_map_for(q), b);
  });
}

AttentionOutput TiledOperator::forward_gpu(const AttentionProblem& p) {
  return run_forward(p, [this](const AttentionProblem& q, AttentionBuffers& b) {
    vulkan::run(gpu_kernel(), q, block_map_for(q).get(), metadata().gpu, b);
  });
}

AttentionGradients TiledOperator::backward_native(const BackwardProblem& p) {
  return native_backward(p);
}

AttentionGradients TiledOperator::backward_cpu(const BackwardProblem& p) {
  return cpu_backward(p);
}

AttentionGradients TiledOperator::backward_gpu(const BackwardProblem& p) {
  return gpu_backward(p, metadata().gpu);
}

std::optional<Reason> TiledOperator::check_backward_inputs(Backend b, const BackwardProblem& p) const {
  return check_shared_backward(b, p, metadata().gpu);
}

}  // namespace attnops
