#include "operators/ragged_paged.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "attnops/error.h"
#include "attnops/paged_problem.h"
#include "backends/cpu/paged_cpu.h"
#include "backends/native/paged_native.h"
#include "backends/native/reference.h"
#include "backends/vulkan/vk_paged.h"
#include "operators/forward_glue.h"

namespace attnops {

namespace {

using i64 = std::int64_t;

// Runs a paged kernel into fresh buffers and wraps them.
template <class Kernel>
AttentionOutput run_paged_forward(const PagedProblem& p, Kernel&& kernel) {
  PagedBuffers b = allocate_paged_buffers(p);
  kernel(p, b);  // an empty batch costs nothing, and still reports what would run
  AttentionOutput out;
  out.attention_outputs = std::move(b.out);
  out.device_attention_outputs = std::move(b.device_out);
  out.lse = std::move(b.lse);
  out.decision.run = std::move(b.run);
  return out;
}

// A dense problem's batch as a ragged batch over pages of Tk tokens: page b is k[b] / v[b] (the
// views themselves: no copy), sequence b is q rows [b * Tq, (b + 1) * Tq) of q seen as [B * Tq,
// Hq, D], with Tk keys. Runs the cpu paged kernel into the dense buffers (out [B, Tq, Hq, Dv] has
// the layout of [N, Hq, Dv]; lse is transposed from [N, Hq] to [B, Hq, Tq]).
void dense_through_paged(const AttentionProblem& p, AttentionBuffers& buffers, const OperationMetadata& md) {
  const i64 N = p.B * p.Tq;
  const PagedKVCache cache = PagedKVCache::wrap(p.k, p.v);
  Tensor q3;
  TensorView qv;
  if (p.q.stride(0) == p.Tq * p.q.stride(1) || p.B == 1) {
    qv = TensorView(p.q.data(), p.dtype, {N, p.Hq, p.D}, {p.q.stride(1), p.q.stride(2), 1});
  } else {
    q3 = Tensor::copy_of(p.q);
    qv = TensorView(q3.data(), p.dtype, {N, p.Hq, p.D});
  }
  Tensor cu(DType::i64, {p.B + 1}), kv(DType::i64, {p.B}), table(DType::i64, {p.B, 1});
  for (i64 b = 0; b <= p.B; ++b) cu.data_as<i64>()[b] = b * p.Tq;
  for (i64 b = 0; b < p.B; ++b) kv.data_as<i64>()[b] = p.Tk, table.data_as<i64>()[b] = b;
  PagedAttentionOptions o;
  o.causal = p.causal;
  o.sliding_window = p.window;
  o.chunk_size = p.chunk;
  o.logits_soft_cap = p.soft_cap;
  if (p.sinks) o.softmax_aux = TensorView(p.sinks, DType::f32, {p.Hq});
  o.return_lse = p.want_lse;
  const PagedPlan plan = plan_paged({cu, kv, table}, cache.spec(), N, p.Hq, o);
  OperationMetadata pmd = md;
  pmd.runtime_dtype.reset();  // p's tensors are already in the runtime dtype
  pmd.softmax_scale = p.scale;
  pmd.num_threads = p.num_threads;
  const PagedProblem pp = make_paged_problem(qv, cache, plan, o, pmd);
  PagedBuffers pb;
  pb.out = buffers.out;  // shared storage: the kernel writes the dense output in place
  if (p.want_lse) pb.lse = Tensor(DType::f32, {N, p.Hq});
  cpu::paged_attention(pp, pb);
  if (buffers.lse) {
    const float* from = pb.lse->data_as<float>();
    float* to = buffers.lse->data_as<float>();
    for (i64 b = 0; b < p.B; ++b)
      for (i64 i = 0; i < p.Tq; ++i)
        for (i64 h = 0; h < p.Hq; ++h) to[(b * p.Hq + h) * p.Tq + i] = from[(b * p.Tq + i) * p.Hq + h];
  }
  buffers.run = std::move(pb.run);
}

}  // namespace

OperationMetadata RaggedPagedAttn::default_metadata() {
  return OperationMetadata{};
}

std::optional<Reason> RaggedPagedAttn::check_inputs(Backend b, const AttentionProblem& p) const {
  if (b != Backend::cpu) return std::nullopt;
  const auto unsupported = [](const char* what) {
    return Reason{
        ReasonCode::unsupported_feature,
        std::string(what) + " has no ragged form: the paged kernels do not take it (the native oracle does)"};
  };
  if (p.bias) return unsupported("bias");
  if (p.has_segments()) return unsupported("segment ids");
  if (p.user_mask) return unsupported("a user mask");
  if (p.Tq > p.Tk && p.Tk > 0)
    return Reason{ReasonCode::unsupported_feature,
                  "q_len=" + std::to_string(p.Tq) + " > kv_len=" + std::to_string(p.Tk) +
                      ": a ragged batch's queries are the last q_len of its keys"};
  return std::nullopt;
}

AttentionOutput RaggedPagedAttn::forward_native(const AttentionProblem& p) {
  return run_forward(
      p, [](const AttentionProblem& q, AttentionBuffers& b) { native::reference_attention(q, b); });
}

AttentionOutput RaggedPagedAttn::forward_cpu(const AttentionProblem& p) {
  return run_forward(
      p, [this](const AttentionProblem& q, AttentionBuffers& b) { dense_through_paged(q, b, metadata()); });
}

std::optional<Reason> RaggedPagedAttn::check_paged_inputs(Backend b, const PagedProblem& p) const {
  if (b != Backend::gpu) return std::nullopt;
  const auto& named = metadata().backends;
  if (!p.k_pages.on_device() && !p.q.on_device() &&
      std::find(named.begin(), named.end(), Backend::gpu) == named.end()) {
    const double mib =
        static_cast<double>((p.k_pages.numel() + p.v_pages.numel()) * static_cast<i64>(dtype_size(p.dtype))) /
        (1024.0 * 1024.0);
    char size[32];
    std::snprintf(size, sizeof size, "%.1f MiB", mib);
    return Reason{ReasonCode::cpu_faster,
                  std::string("a host cache would be uploaded whole (") + size +
                      ") every call; auto keeps host caches on the cpu (keep the cache on the device with "
                      "PagedKVCache::device, or ask for backend gpu)"};
  }
  return vulkan::check_paged_inputs(p, metadata().gpu);
}

AttentionOutput RaggedPagedAttn::paged_native(const PagedProblem& p) {
  return run_paged_forward(p, [](const PagedProblem& q, PagedBuffers& b) { native::paged_reference(q, b); });
}

AttentionOutput RaggedPagedAttn::paged_cpu(const PagedProblem& p) {
  return run_paged_forward(p, [](const PagedProblem& q, PagedBuffers& b) { cpu::paged_attention(q, b); });
}

AttentionOutput RaggedPagedAttn::paged_gpu(const PagedProblem& p) {
  return run_paged_forward(
      p, [this](const PagedProblem& q, PagedBuffers& b) { vulkan::run_paged(q, metadata().gpu, b); });
}

}  // namespace attnops
