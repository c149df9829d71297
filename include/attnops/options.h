// Per-call attention options (what model code passes on each call) and the AttentionOutput.
// q, k and v may be host tensors or device tensors (device_tensor.h) in any mix; the output stays
// on the device when q is there. Options tensors (bias, segment ids, sinks) are host tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnops/decision.h"
#include "attnops/device_tensor.h"
#include "attnops/dtype.h"
#include "attnops/mask.h"
#include "attnops/tensor.h"

namespace attnops {

// Sliding window: query at absolute position p sees keys p - left <= j <= p + right.
struct Window {
  std::int64_t left = 0;
  std::int64_t right = 0;
};

// Every member has a default initializer so that designated initializers such as
// {.causal = true, .sliding_window = {{256, 0}}} compile warning-free under -Wextra.
struct AttentionOptions {
  bool causal = true;                          // bottom-right aligned (see mask.h)
  std::optional<Window> sliding_window{};      // (left, right), both >= 0
  std::optional<std::int64_t> chunk_size{};    // chunked causal, >= 1
  std::optional<TensorView> segment_ids_q{};   // [B, Tq] i32 or i64
  std::optional<TensorView> segment_ids_kv{};  // [B, Tk] i32 or i64
  std::optional<TensorView> bias{};            // additive, [B|1, Hq|1, Tq, Tk], float dtypes
  std::optional<double> logits_soft_cap{};     // s = cap * tanh(s / cap), cap > 0
  std::optional<TensorView> sinks{};           // one logit per q head, [Hq] (see README, Semantics)
  std::optional<TensorView> softmax_aux{};     // EasyDeL's name for sinks: set one (both: Error)
  std::optional<Mask> mask{};                  // extra static mask, ANDed with the above
  bool return_lse = false;                     // lse [B, Hq, Tq] f32 (natural log; -inf if empty)
  bool return_weights = false;                 // probabilities [B, Hq, Tq, Tk] f32; vanilla only
  bool profile = false;                        // time the call (decision.run.timings); also ATTNOPS_PROFILE=1

  // Per-call settings: each overrides the operator's OperationMetadata for this call only (unset
  // = the metadata's value), so a caller varying them never builds another operator. The
  // decision's `settings` records the ones a call set.
  std::optional<double> softmax_scale{};           // nullopt = metadata's, else 1 / sqrt(D)
  std::optional<std::vector<Backend>> backends{};  // preference, tried in order; {} = auto (see below)
  std::optional<int> num_threads{};                // 0 = OpenMP's default; clamped to the hardware
  std::optional<DType> runtime_dtype{};            // f32, f16 or bf16: inputs converted to it
  // A backend this call names is tried even when the metadata disables it: the caller asked for
  // exactly it (as the CLI's --backend does); those it does not name follow in the auto order.
};

// What a call returns. The output is `out` (as in Python and the README); EasyDeL's spelling
// attention_outputs() / device_attention_outputs() names the same tensors.
struct AttentionOutput {
  Tensor out;                 // [B, Tq, Hq, Dv], in the runtime dtype (empty when on the device)
  DeviceTensor device_out;    // the same, when q was a device tensor (gpu only)
  std::optional<Tensor> lse;  // [B, Hq, Tq] f32 when return_lse
  std::optional<Tensor> attention_weights;  // [B, Hq, Tq, Tk] f32 when return_weights
  DispatchDecision decision;                // which operator and backend ran, and why

  Tensor& attention_outputs() { return out; }
  const Tensor& attention_outputs() const { return out; }
  DeviceTensor& device_attention_outputs() { return device_out; }
  const DeviceTensor& device_attention_outputs() const { return device_out; }
};

}  // namespace attnops
