#include "operators/ragged_paged.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>

#include "attnops/error.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
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
  out.out = std::move(b.out);
  out.device_out = std::move(b.device_out);
  out.lse = std::move(b.lse);
  out.decision.run = std::move(b.run);
  return out;
}

// A dense problem's batch as a ragged batch over pages of Tk tokens: page b is k[b] / v[b] (the
// views themselves, host or device: no copy), sequence b is q rows [b * Tq, (b + 1) * Tq) of q
// seen as [B * Tq, Hq, D], with Tk keys. Holds what the paged problem's views point into.
struct DenseAsPaged {
  Tensor q3, cu, kv, table;
  PagedKVCache cache;
  PagedPlan plan;
  PagedAttentionOptions options;
  PagedProblem pp;
};

// Tk >= 1 (a page of 0 tokens does not exist; run_forward handles Tk == 0 on the host).
std::unique_ptr<DenseAsPaged> dense_as_paged(const AttentionProblem& p, const OperationMetadata& md) {
  auto d = std::make_unique<DenseAsPaged>();
  const i64 N = p.B * p.Tq;
  d->cache = PagedKVCache::wrap(p.k, p.v);
  TensorView qv;
  const bool rows_collapse = p.q.stride(0) == p.Tq * p.q.stride(1) || p.B == 1;
  if (p.q.on_device()) {
    if (!rows_collapse)
      throw Error(ErrorCode::unsupported_feature,
                  "q: a device view whose batch rows are not Tq token rows apart (make it contiguous)");
    qv = TensorView(p.q.device_storage(), p.q.device_offset(), p.dtype, {N, p.Hq, p.D},
                    {p.q.stride(1), p.q.stride(2), 1});
  } else if (rows_collapse) {
    qv = TensorView(p.q.data(), p.dtype, {N, p.Hq, p.D}, {p.q.stride(1), p.q.stride(2), 1});
  } else {
    d->q3 = Tensor::copy_of(p.q);
    qv = TensorView(d->q3.data(), p.dtype, {N, p.Hq, p.D});
  }
  d->cu = Tensor(DType::i64, {p.B + 1}), d->kv = Tensor(DType::i64, {p.B}),
  d->table = Tensor(DType::i64, {p.B, 1});
  for (i64 b = 0; b <= p.B; ++b) d->cu.data_as<i64>()[b] = b * p.Tq;
  for (i64 b = 0; b < p.B; ++b) d->kv.data_as<i64>()[b] = p.Tk, d->table.data_as<i64>()[b] = b;
  PagedAttentionOptions& o = d->options;
  o.causal = p.causal;
  o.sliding_window = p.window;
  o.chunk_size = p.chunk;
  o.logits_soft_cap = p.soft_cap;
  if (p.sinks) o.sinks = TensorView(p.sinks, DType::f32, {p.Hq});
  o.return_lse = p.want_lse;
  d->plan = plan_paged({d->cu, d->kv, d->table}, d->cache.spec(), N, p.Hq, o);
  OperationMetadata pmd = md;
  pmd.runtime_dtype.reset();  // p's tensors are already in the runtime dtype
  pmd.softmax_scale = p.scale;
  pmd.num_threads = p.num_threads;
  d->pp = make_paged_problem(qv, d->cache, d->plan, o, pmd);
  return d;
}

// Runs a paged kernel on a dense problem into the dense buffers (out [B, Tq, Hq, Dv] has the
// layout of [N, Hq, Dv]: the kernel writes it in place; lse is transposed from [N, Hq] to [B,
// Hq, Tq]; a device output is re-viewed as [B, Tq, Hq, Dv]).
template <class Kernel>
void dense_through_paged(const AttentionProblem& p, AttentionBuffers& buffers, const OperationMetadata& md,
                         Kernel&& kernel) {
  const i64 N = p.B * p.Tq;
  const std::unique_ptr<DenseAsPaged> d = dense_as_paged(p, md);
  PagedBuffers pb;
  if (!p.q.on_device()) pb.out = buffers.out;  // shared storage: the kernel writes the dense output in place
  if (p.want_lse) pb.lse = Tensor(DType::f32, {N, p.Hq});
  kernel(d->pp, pb);
  if (p.q.on_device())
    buffers.device_out = DeviceTensor(pb.device_out.storage(), p.dtype, {p.B, p.Tq, p.Hq, p.Dv});
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
  if (b == Backend::native) return std::nullopt;
  const auto unsupported = [](const std::string& what) {
    return Reason{ReasonCode::unsupported_feature,
                  what + " has no ragged form: the paged kernels do not take it (the native oracle does)"};
  };
  if (p.bias) return unsupported("bias");
  if (p.has_segments()) return unsupported("segment ids");
  if (p.user_mask) return unsupported("a user mask");
  if (p.Tq > p.Tk && p.Tk > 0)
    return Reason{ReasonCode::unsupported_feature,
                  "q_len=" + std::to_string(p.Tq) + " > kv_len=" + std::to_string(p.Tk) +
                      ": a ragged batch's queries are the last q_len of its keys"};
  if (b != Backend::gpu) return std::nullopt;
  if (p.Tk == 0 || p.B == 0 || p.Hq == 0)
    return Reason{ReasonCode::unsupported_feature,
                  "an empty problem (no keys, batch or heads) has no page to view"};
  try {
    return vulkan::check_paged_inputs(dense_as_paged(p, metadata())->pp, metadata().gpu);
  } catch (const Error& e) {
    return Reason{ReasonCode::unsupported_feature, e.what()};
  }
}

AttentionOutput RaggedPagedAttn::forward_native(const AttentionProblem& p) {
  return run_forward(
      p, [](const AttentionProblem& q, AttentionBuffers& b) { native::reference_attention(q, b); });
}

AttentionOutput RaggedPagedAttn::forward_cpu(const AttentionProblem& p) {
  return run_forward(p, [this](const AttentionProblem& q, AttentionBuffers& b) {
    dense_through_paged(q, b, metadata(),
                        [](const PagedProblem& pp, PagedBuffers& pb) { cpu::paged_attention(pp, pb); });
  });
}

AttentionOutput RaggedPagedAttn::forward_gpu(const AttentionProblem& p) {
  return run_forward(p, [this](const AttentionProblem& q, AttentionBuffers& b) {
    dense_through_paged(q, b, metadata(), [this](const PagedProblem& pp, PagedBuffers& pb) {
      vulkan::run_paged(pp, metadata().gpu, pb);
    });
  });
}

std::optional<Reason> RaggedPagedAttn::check_paged_inputs(Backend b, const PagedProblem& p) const {
  if (b != Backend::gpu) return std::nullopt;
  if (!p.k_pages.on_device() && !p.q.on_device() && !p.gpu_asked) {
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
