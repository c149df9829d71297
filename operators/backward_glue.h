// The backward_* implementations the built-in operators share. The gradient is a property of
// the attention function, not of the forward's algorithm, so vanilla, blocksparse and
// flash_attn2 run the same backward kernels: the fp64 oracle on native, and on cpu and gpu the
// tiled FlashAttention-2 backward over the block map of the call's mask (for vanilla too: it
// needs only out and lse, which every forward returns, and keeps memory independent of Tq x Tk
// where a materialised-scores backward would hold P per head).
#pragma once

#include "attnops/backward.h"
#include "attnops/ext/backward_problem.h"

namespace attnops {

// Empty problems (no batch, queries or keys: every gradient is zero) are answered without a
// kernel; otherwise the kernel fills zero-initialised buffers.
AttentionGradients native_backward(const BackwardProblem& bp);
AttentionGradients cpu_backward(const BackwardProblem& bp);
AttentionGradients gpu_backward(const BackwardProblem& bp, const GpuSettings& settings);
// check_backward_inputs of the operators that have these backwards: the gpu's device limits.
std::optional<Reason> check_shared_backward(Backend b, const BackwardProblem& bp,
                                            const GpuSettings& settings);

}  // namespace attnops
