// The dense problems of the fuzzer: what one case draws (DenseSpec, plain data, from SEED:CASE
// alone), and its inputs (DenseInputs: tensors, views and AttentionOptions, from the spec alone).
// Keeping the two apart is what makes replay and shrinking work: a shrunk case is the same spec
// with smaller sizes, materialised again.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/config.h"
#include "attnops/options.h"
#include "attnops/tensor.h"
#include "verify/mask_spec.h"
#include "verify/views.h"

namespace attnops::verify {

// How large and how wild problems may be.
struct Limits {
  std::int64_t max_work = std::int64_t{1} << 26;  // B * Hq * Tq * Tk * (D + Dv) of one problem, at most
  std::int64_t max_seq = 4096;                    // Tq, Tk at most
  bool nonfinite = true;                          // NaN / inf in some inputs
  // When not empty, D and Dv are drawn from these only: a GPU compiles a pipeline per head-dim
  // pair, so a long run on a software device (lavapipe: ~1 s of LLVM per pipeline) needs few.
  std::vector<std::int64_t> head_dims;
};

enum class BiasShape { none, full, batch1, head1, both1 };  // [B, Hq], [1, Hq], [B, 1], [1, 1] x [Tq, Tk]

// A NaN or infinity planted in one element. `at` holds a fraction per dimension, so the element
// stays inside the tensor when the shrinker makes it smaller.
struct Injection {
  char tensor = 'q';  // q, k, v, b (bias), s (sinks), g (dout)
  float value = 0;
  std::array<double, 4> at{};
};

struct DenseSpec {
  std::uint64_t seed = 0, index = 0;
  std::int64_t B = 1, Tq = 1, Tk = 1, Hq = 1, Hkv = 1, D = 1, Dv = 1;
  DType dtype = DType::f32;
  bool causal = true;
  std::optional<Window> window;
  std::optional<std::int64_t> chunk;
  std::optional<MaskSpec> mask;
  int segments =
      0;  // 0 none; 1 independent runs for q and kv; 2 packed (shared ids), one q row matching no key
  bool segments_i64 = false;
  BiasShape bias = BiasShape::none;
  bool bias_f16 = false;          // the bias given in f16 (converted to f32 by the library)
  bool bias_inf_row = false;      // one bias row all -inf: a fully masked row
  bool bias_inf_entries = false;  // some -inf entries: masked keys
  std::optional<double> soft_cap;
  bool sinks = false;
  std::optional<double> scale;            // softmax_scale (metadata); nullopt = 1 / sqrt(D)
  float q_amp = 1, k_amp = 1, v_amp = 1;  // values uniform in [-amp, amp]: large q gives large logits
  std::vector<Injection> nonfinite;
  std::array<StorageLayout, 3> layout{};  // q, k, v
  std::optional<std::int64_t> bq, bk;     // blocksize_q / blocksize_k (config)
  bool fallbacks_off = false;             // blocksparse / flash_attn2 run their own kernel on every shape
  bool return_lse = true;
  bool return_weights = false;  // vanilla only

  std::int64_t work() const { return B * Hq * Tq * Tk * (D + Dv); }
  // One line: shapes, dtype and every option drawn.
  std::string describe() const;
};

DenseSpec draw_dense(std::uint64_t seed, std::uint64_t index, const Limits& limits);

// The spec with new sizes (the shrinker's and --shape's): Hkv is lowered to a divisor of Hq.
DenseSpec with_shape(DenseSpec s, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq,
                     std::int64_t Hkv, std::int64_t D, std::int64_t Dv);

struct DenseInputs {
  std::vector<Placed> qkv;  // q, k, v (views into their storage)
  TensorView q, k, v;
  Tensor dout;  // [B, Tq, Hq, Dv] in the dtype
  std::optional<Tensor> seg_q, seg_kv, bias, sinks;
  AttentionOptions options;  // views of the tensors above
};

DenseInputs materialize(const DenseSpec& s);

// The config for this spec's calls on exactly `backend` (forced_config, target.h) with its block
// sizes, softmax scale and fallbacks.
Config config_for(const DenseSpec& s, Backend backend, int threads);

}  // namespace attnops::verify
