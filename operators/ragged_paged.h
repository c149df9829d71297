// RaggedPagedAttn (name "ragged_paged", alias "paged"): one call for a mixed batch of decode,
// chunked-prefill and prefill sequences over a paged KV cache (paged.h). Its paged forwards:
//   native  the fp64 oracle: each sequence's keys gathered, the dense oracle (bitwise the dense
//           native call on them)
//   cpu     per ISA tier: stream items on the paged stream kernel, tile items on the tiled kernel
//           (backends/cpu/paged_cpu.h)
//   gpu     Vulkan (backends/vulkan/vk_paged.h): the work list's rows and KV splits on one
//           workgroup each, then a merge pass; device-resident caches read in place. Under auto a
//           host cache stays off the gpu (it would be uploaded whole every call): reason
//           cpu_faster; asking for the gpu (backend: gpu, --backend gpu) runs it there.
//   tpu     backend_unavailable, as every operator
// A dense call (attn(q, k, v)) is the batch of its B sequences of Tq queries over Tk keys each, on
// pages of Tk tokens (k and v viewed in place, host or device): the same kernels, so the operator
// is usable (and testable) like the others. What a ragged batch has no form for (bias, segment
// ids, user masks, weights, Tq > Tk; on the gpu also Tk == 0) is unsupported_feature on the cpu
// and the gpu; the native oracle runs everything.
#pragma once

#include "attnops/ext/operation.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"

namespace attnops {

class RaggedPagedAttn : public OperationImpl {
 public:
  using OperationImpl::OperationImpl;
  static OperationMetadata default_metadata();  // no fallbacks

  std::string name() const override { return "ragged_paged"; }
  std::vector<std::string> aliases() const override { return {"paged"}; }

  bool implements(Backend b) const override {
    return b == Backend::native || b == Backend::cpu || b == Backend::gpu;
  }
  std::optional<Reason> check_inputs(Backend b, const AttentionProblem& p) const override;
  AttentionOutput forward_native(const AttentionProblem& p) override;
  AttentionOutput forward_cpu(const AttentionProblem& p) override;
  AttentionOutput forward_gpu(const AttentionProblem& p) override;

  bool implements_paged(Backend b) const override {
    return b == Backend::native || b == Backend::cpu || b == Backend::gpu;
  }
  std::optional<Reason> check_paged_inputs(Backend b, const PagedProblem& p) const override;
  AttentionOutput paged_native(const PagedProblem& p) override;
  AttentionOutput paged_cpu(const PagedProblem& p) override;
  AttentionOutput paged_gpu(const PagedProblem& p) override;
};

}  // namespace attnops
