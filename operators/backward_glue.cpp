#include "operators/backward_glue.h"

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map.h"
#include "backends/cpu/tiled_backward.h"
#include "backends/native/reference_backward.h"
#include "backends/vulkan/vulkan_backend.h"

namespace attnops {

namespace {

template <class Kernel>
AttentionGradients run_backward(const BackwardProblem& bp, Kernel&& kernel) {
  GradientBuffers g = allocate_gradient_buffers(bp);
  const AttentionProblem& p = bp.fwd;
  if (p.B > 0 && p.Tq > 0 && p.Tk > 0) kernel(bp, g);
  AttentionGradients out;
  out.dq = std::move(g.dq);
  out.dk = std::move(g.dk);
  out.dv = std::move(g.dv);
  out.dsinks = std::move(g.dsinks);
  out.dbias = std::move(g.dbias);
  out.decision.run = std::move(g.run);
  return out;
}

}  // namespace

AttentionGradients native_backward(const BackwardProblem& bp) {
  return run_backward(bp,
                      [](const BackwardProblem& x, GradientBuffers& g) { native::reference_backward(x, g); });
}

AttentionGradients cpu_backward(const BackwardProblem& bp) {
  return run_backward(bp, [](const BackwardProblem& x, GradientBuffers& g) {
    const AttentionProblem& p = x.fwd;
    cpu::tiled_backward(x, *get_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k), g);
  });
}

AttentionGradients gpu_backward(const BackwardProblem& bp, const GpuSettings& settings) {
  return run_backward(
      bp, [&](const BackwardProblem& x, GradientBuffers& g) { vulkan::run_backward(x, settings, g); });
}

std::optional<Reason> check_shared_backward(Backend b, const BackwardProblem& bp,
                                            const GpuSettings& settings) {
  if (b == Backend::gpu) return vulkan::check_backward_inputs(bp, settings);
  return std::nullopt;
}

}  // namespace attnops
