// PagedProblem: the validated, normalised parameters of one paged call (paged.h), built once per
// call by make_paged_problem() as make_problem() builds AttentionProblem for dense calls; every
// backend's paged kernel takes it. Also the plan's data (PagedPlanData), which the kernels
// read, and the per-row key range the masks leave visible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "attnops/decision.h"
#include "attnops/metadata.h"
#include "attnops/options.h"
#include "attnops/paged.h"
#include "attnops/tensor.h"

namespace attnops {

// Which sequences become stream items (plan_paged): those with q_len <= kPagedStreamMaxQ or at
// most kPagedStreamMaxRows query rows per kv head (G * q_len); the others become one tile item.
inline constexpr std::int64_t kPagedStreamMaxQ = 2;
inline constexpr std::int64_t kPagedStreamMaxRows = 32;

// The plan's data, which the kernels read.
const PagedPlanData& plan_data(const PagedPlan& plan);

// A key interval [lo, hi) (empty when lo >= hi).
struct KeyRange {
  std::int64_t lo = 0, hi = 0;
};

struct PagedPlanData {
  PagedAttentionOptions options;  // as given to plan_paged, softmax_aux pointing at `sinks`
  Tensor sinks;                   // a copy of options.softmax_aux (empty without sinks)
  PagedKVSpec cache;
  std::int64_t S = 0, N = 0, Hq = 0, split_tokens = kDefaultKvSplitTokens;
  bool causal = true;
  std::optional<Window> window;
  std::optional<std::int64_t> chunk;
  // Per sequence s < S: q rows [q_begin, q_begin + q_len), kv_len keys, and its pages
  // page_ids[page_begin[s] .. page_begin[s + 1]) (ceil(kv_len / page_size) of them).
  std::vector<std::int64_t> q_begin, q_len, kv_len, page_begin;
  std::vector<std::int32_t> page_ids;
  std::vector<PagedWorkItem> work;
  std::int64_t num_stream_items = 0;  // work[0, num_stream_items) are shared and stream items
  std::int64_t num_shared_items = 0;  // work[0, num_shared_items) are shared items
  std::vector<PagedSharedMember> members;
  std::int64_t shared_keys = 0;
  // Per sequence: the keys any of its rows sees (empty for q_len 0 or fully masked), whether it
  // is a stream sequence, its splits (stream sequences: the split boundaries' count, 0 else) and
  // whether any of them is in a shared item.
  std::vector<KeyRange> unions;
  std::vector<std::int32_t> num_splits;
  std::vector<char> is_stream, in_shared;
};

// The keys [lo, hi) query row i (0-based within its sequence) of a sequence with q_len queries
// and kv_len keys sees under causal / window / chunk: every combination of them leaves an
// interval (empty when lo >= hi). Query i sits at p = kv_len - q_len + i >= 0.
inline KeyRange visible_keys(bool causal, const std::optional<Window>& window,
                             const std::optional<std::int64_t>& chunk, std::int64_t q_len,
                             std::int64_t kv_len, std::int64_t i) {
  const std::int64_t p = kv_len - q_len + i;
  KeyRange r{0, kv_len};
  if (causal) r.hi = std::min(r.hi, p + 1);
  if (window) {
    r.lo = std::max(r.lo, p - window->left);
    r.hi = std::min(r.hi, p + window->right + 1);
  }
  if (chunk) {  // j <= p and floor(j / C) == floor(p / C), with p >= 0
    r.hi = std::min(r.hi, p + 1);
    r.lo = std::max(r.lo, p / *chunk * *chunk);
  }
  return r;
}
inline KeyRange visible_keys(const PagedPlanData& d, std::int64_t s, std::int64_t i) {
  return visible_keys(d.causal, d.window, d.chunk, d.q_len[static_cast<std::size_t>(s)],
                      d.kv_len[static_cast<std::size_t>(s)], i);
}

struct PagedProblem {
  std::int64_t N = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0, page_size = 0, num_pages = 0;
  std::int64_t group() const { return Hq / Hkv; }  // q head h reads kv head h / group()
  DType dtype = DType::f32;                        // q and the output (and a float cache's pages)
  DType kv_dtype = DType::f32;                     // the pages: dtype, or int8 / fp8_e4m3 codes
  TensorView q;                                    // [N, Hq, D], stride(2) == 1
  TensorView k_pages, v_pages;  // [P, page_size, Hkv, D | Dv], stride(3) == 1; host or device
  // 8-bit caches: value = code x scale (kv_quant.h). Per token: scale pools [P, page_size, Hkv] f32
  // (where the pages are); per tensor: k_scale / v_scale (and the views empty).
  KVScales scales = KVScales::per_token;
  TensorView k_scales, v_scales;
  float k_scale = 1.f, v_scale = 1.f;
  PagedPlan plan;                        // the batch and its work list
  const PagedPlanData* batch = nullptr;  // = &plan_data(plan)

  double scale = 1.0;  // softmax scale (1/sqrt(D) unless the metadata sets one)
  std::optional<double> soft_cap;
  const float* sinks = nullptr;  // [Hq] or null
  bool want_lse = false;
  bool profile = false;
  int num_threads = 0;  // 0 = OpenMP default; never above max_worker_threads()
  // The call's (else the metadata's) backend preference names the gpu: auto's rule that keeps
  // host caches on the cpu does not apply.
  bool gpu_asked = false;
  // As AttentionProblem::guard_nonfinite_v: set by a backend's re-run of the sequences whose
  // output came out non-finite while their values hold NaN / inf (weight-0 keys then skipped).
  bool guard_nonfinite_v = false;
  std::vector<Tensor> owned;  // converted inputs the views above may point into

  bool on_device() const { return q.on_device() || k_pages.on_device() || v_pages.on_device(); }
  bool quantized() const { return is_kv8(kv_dtype); }
  bool per_token_scales() const { return quantized() && scales == KVScales::per_token; }
  // The element offset of (page, row, head, 0) in the K / V pools.
  std::int64_t k_offset(std::int64_t page, std::int64_t row, std::int64_t head) const {
    return page * k_pages.stride(0) + row * k_pages.stride(1) + head * k_pages.stride(2);
  }
  std::int64_t v_offset(std::int64_t page, std::int64_t row, std::int64_t head) const {
    return page * v_pages.stride(0) + row * v_pages.stride(1) + head * v_pages.stride(2);
  }
  // The element offset of (page, row, head) in the per-token scale pools.
  std::int64_t ks_offset(std::int64_t page, std::int64_t row, std::int64_t head) const {
    return page * k_scales.stride(0) + row * k_scales.stride(1) + head * k_scales.stride(2);
  }
  std::int64_t vs_offset(std::int64_t page, std::int64_t row, std::int64_t head) const {
    return page * v_scales.stride(0) + row * v_scales.stride(1) + head * v_scales.stride(2);
  }
};

// Validates one paged call against its plan: q [N, Hq, D] with N and Hq as planned, the cache's
// shape as planned, q's dtype the cache's for a float cache (any float dtype for an 8-bit one),
// and the runtime dtype, when the call or the metadata sets one,
// the mask options as planned, the soft cap, sinks [Hq] and scale as make_problem checks them.
// Throws Error (shape_mismatch, unsupported_dtype, invalid_argument) naming the argument.
PagedProblem make_paged_problem(const TensorView& q, const PagedKVCache& cache, const PagedPlan& plan,
                                const PagedAttentionOptions& options, const OperationMetadata& metadata);

// Output storage of one paged call: out [N, Hq, Dv] in the problem's dtype, zero-filled (rows no
// item writes, padding and fully masked ones, stay 0); lse [N, Hq] f32 filled with -inf when
// want_lse. A caller may hand a kernel buffers of another shape with the same contiguous
// layout (the dense form of the operator does: out [B, Tq, Hq, Dv]).
// When q is a device tensor (gpu only) out stays empty and the gpu leaves the output in
// device_out ([N, Hq, Dv] in the problem's dtype).
struct PagedBuffers {
  Tensor out;
  std::optional<Tensor> lse;
  RunInfo run;
  DeviceTensor device_out;
};
PagedBuffers allocate_paged_buffers(const PagedProblem& p);

}  // namespace attnops
