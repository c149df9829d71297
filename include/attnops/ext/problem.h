// AttentionProblem: the validated, normalised parameters of one attention call (in the spirit of
// PyTorch SDPA's sdp_params). Built once per call by make_problem(); every backend kernel takes
// it, so kernels never re-validate and never see an option they must not interpret.
//
// Normalisation done here, so kernels stay simple:
//  - q, k, v share one storage dtype (runtime_dtype, or q's dtype); converted copies are owned.
//  - innermost dims are contiguous (copied when a view is not).
//  - segment ids become contiguous i32 [B, Tq] / [B, Tk].
//  - bias becomes contiguous f32 [Bb, Hb, Tq, Tk] with Bb in {1, B}, Hb in {1, Hq}.
//  - sinks become contiguous f32 [Hq].
//  - the static mask is one Mask: causal & local(window) & chunked_causal(chunk) & options.mask.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnops/decision.h"
#include "attnops/device_tensor.h"
#include "attnops/host.h"
#include "attnops/mask.h"
#include "attnops/metadata.h"
#include "attnops/options.h"
#include "attnops/tensor.h"

namespace attnops {

struct AttentionProblem {
  std::int64_t B = 0, Tq = 0, Tk = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0;
  std::int64_t group() const { return Hq / Hkv; }  // q heads per kv head; q head h reads kv h / group
  DType dtype = DType::f32;                        // storage dtype of q, k, v and of the output
  TensorView q, k, v;                              // BTHD; stride(3) == 1

  double scale = 1.0;  // softmax scale (double so the fp64 oracle is exact; kernels cast)

  // Mask semantics, as given (the oracle evaluates these directly) ...
  bool causal = true;
  std::optional<Window> window;
  std::optional<std::int64_t> chunk;
  std::optional<Mask> user_mask;
  // ... and combined into one static mask (kernels and block maps use this).
  Mask mask;
  bool has_mask() const { return mask.kind() != Mask::Kind::full; }

  const std::int32_t* seg_q = nullptr;   // [B, Tq] or null
  const std::int32_t* seg_kv = nullptr;  // [B, Tk] or null
  bool has_segments() const { return seg_q != nullptr; }

  const float* bias = nullptr;                        // [Bb, Hb, Tq, Tk] or null
  std::int64_t bias_stride_b = 0, bias_stride_h = 0;  // 0 where broadcast; rows are Tk apart
  const float* bias_row(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return bias + b * bias_stride_b + h * bias_stride_h + i * Tk;
  }

  std::optional<double> soft_cap;  // s = cap * tanh(s / cap), before bias and mask
  const float* sinks = nullptr;    // [Hq] or null

  bool want_lse = false;
  bool want_weights = false;
  bool profile = false;  // options.profile or ATTNOPS_PROFILE=1: backends report timings
  bool on_device() const { return q.on_device() || k.on_device() || v.on_device(); }
  std::int64_t blocksize_q = 128, blocksize_k = 128;
  int num_threads = 0;  // 0 = OpenMP default; never above max_worker_threads()

  // v holds a NaN or an infinity. Set by the forward glue only when a first run produced a
  // non-finite output and v is found to hold one; kernels then never multiply a weight of 0 by
  // v (0 x inf = NaN would let a masked key's value reach the row), at some cost in speed.
  bool guard_nonfinite_v = false;

  // Storage of converted inputs (pointers above may point here).
  std::vector<Tensor> owned;
};

// Validates and normalises one call. Throws attnops::Error (shape_mismatch, unsupported_dtype,
// invalid_argument) whose message names the argument, the shape found and the shape expected.
// Besides shapes and dtypes it refuses what fp32 kernels cannot compute faithfully: outputs
// larger than kMaxTensorBytes, a soft cap outside the normal f32 range, and a softmax_scale
// above 1 that can carry finite inputs past the f32 range (|scale| * D * max|q| * max|k| >
// FLT_MAX, over the finite elements of q and k; checked only for |scale| > 1, so the default
// 1/sqrt(D) costs nothing).
AttentionProblem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOptions& options, const OperationMetadata& metadata);

// Output storage of one call, allocated for a problem: out [B, Tq, Hq, Dv] in problem.dtype,
// zero-filled (not allocated when q is on the device: the gpu backend allocates device_out);
// lse [B, Hq, Tq] f32 when want_lse; weights [B, Hq, Tq, Tk] f32 when want_weights.
// (Large tensors come zeroed from the OS, so the zero fill costs no pass over memory; kernels
// still write every element of out and lse, except vanilla cpu, which leaves fully masked
// rows' out and invisible weights at the zero they start with.)
struct AttentionBuffers {
  Tensor out;
  std::optional<Tensor> lse;
  std::optional<Tensor> weights;
  DeviceTensor device_out;  // the output when q is on the device (then `out` stays empty)
  RunInfo run;              // the kernel fills it in; it ends up in AttentionOutput::decision.run
};
AttentionBuffers allocate_buffers(const AttentionProblem& p);

// Multiply-adds of the two products (q.k and p.v) over the visible (i, j) pairs: 2*(D+Dv) flops
// per visible pair per head, the convention of the benchmarks. `visible_pairs` counts pairs of
// one (batch, head); dense = Tq * Tk.
double attention_flops(const AttentionProblem& p, double visible_pairs_per_head);

}  // namespace attnops
