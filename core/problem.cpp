// make_problem: validation of one call's inputs and their normalisation for the kernels.
#include "attnops/ext/problem.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <thread>

#include "attnops/environment.h"
#include "attnops/error.h"
#include "core/checked_size.h"
#include "core/sinks_option.h"

namespace attnops {

namespace {

// Largest window / chunk we accept: keeps p - L and p + R far from int64 overflow.
constexpr std::int64_t kMaxExtent = std::int64_t{1} << 40;

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, msg);
}

std::string dims_string(const TensorView& t) {
  return shape_string(t.shape());
}

void require_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  if (t.data() == nullptr && !t.on_device() && t.numel() != 0)
    fail(ErrorCode::invalid_argument, std::string(name) + ": null data pointer");
  if (t.rank() != rank)
    fail(ErrorCode::shape_mismatch, std::string(name) + ": expected rank " + std::to_string(rank) + " " +
                                        layout + ", got rank " + std::to_string(t.rank()) + " " +
                                        dims_string(t));
}

void require_float(const TensorView& t, const char* name) {
  if (!is_float(t.dtype()))
    fail(ErrorCode::unsupported_dtype, std::string(name) +
                                           ": expected a float dtype (f32, f16 or bf16), got " +
                                           std::string(dtype_name(t.dtype())));
}

// A contiguous copy of `t` in `dtype` into p.owned; a failure names the argument. A device
// tensor is never copied on the host: it must come in the runtime dtype, contiguous in its last
// dimension.
const Tensor& owned_copy(AttentionProblem& p, const TensorView& t, DType dtype, const char* name) {
  if (t.on_device())
    fail(ErrorCode::unsupported_dtype,
         std::string(name) + ": a device tensor " + dims_string(t) + " in " +
             std::string(dtype_name(t.dtype())) + " would need a conversion to " +
             std::string(dtype_name(dtype)) +
             " or a copy (innermost stride != 1) on the host: make it in the runtime "
             "dtype, contiguous in its last dimension");
  try {
    p.owned.push_back(Tensor::copy_of(t, dtype));
  } catch (const Error& e) {
    throw Error(e.code(), std::string(name) + ": " + e.what());
  }
  return p.owned.back();
}

// A view with stride(last) == 1, copying (into p.owned) when the view is not, or converting
// to `dtype` when it differs.
TensorView normalised(AttentionProblem& p, const TensorView& t, DType dtype, const char* name) {
  if (t.dtype() == dtype && (t.rank() == 0 || t.stride(t.rank() - 1) == 1 || t.dim(t.rank() - 1) <= 1))
    return t;
  return owned_copy(p, t, dtype, name).view();
}

const void* contiguous(AttentionProblem& p, const TensorView& t, DType dtype, const char* name) {
  if (t.dtype() == dtype && t.is_contiguous()) return t.data();
  return owned_copy(p, t, dtype, name).data();
}

// An output of `dims` elements of `dtype` must be allocatable (kMaxTensorBytes), e.g.
// "out: [B, Tq, Hq, Dv] = [1, 1, 1, 4611686018427387904] of f32 needs more than 2^47 bytes".
void require_output_size(const char* name, const char* layout, std::array<std::int64_t, 4> dims4,
                         std::size_t rank, DType dtype, const TensorView& q, const TensorView& k,
                         const TensorView& v) {
  const auto n = checked_numel(dims4.data(), rank);
  const auto bytes = n ? checked_mul(*n, static_cast<std::int64_t>(dtype_size(dtype))) : std::nullopt;
  if (!bytes || *bytes > kMaxTensorBytes) {
    // The message is built only here: a valid call allocates nothing for it.
    const std::vector<std::int64_t> dims(dims4.begin(), dims4.begin() + static_cast<std::ptrdiff_t>(rank));
    fail(ErrorCode::invalid_argument, std::string(name) + ": " + layout + " = " + shape_string(dims) +
                                          " of " + std::string(dtype_name(dtype)) +
                                          " needs more than the maximum tensor size of 2^47 bytes (from q " +
                                          dims_string(q) + ", k " + dims_string(k) + " and v " +
                                          dims_string(v) + ")");
  }
}

// Largest |x| over the finite elements of a float view (non-finite ones follow the non-finite
// policy, not the range check).
double max_abs_finite(const TensorView& t) {
  double m = 0;
  const std::int64_t n0 = t.dim(0), n1 = t.dim(1), n2 = t.dim(2), n3 = t.dim(3);
  for (std::int64_t a = 0; a < n0; ++a)
    for (std::int64_t b = 0; b < n1; ++b)
      for (std::int64_t c = 0; c < n2; ++c) {
        const std::int64_t base = a * t.stride(0) + b * t.stride(1) + c * t.stride(2);
        for (std::int64_t d = 0; d < n3; ++d) {
          const double x = std::fabs(load_as_float(t.data(), t.dtype(), static_cast<std::size_t>(base + d)));
          if (x > m && std::isfinite(x)) m = x;
        }
      }
  return m;
}

std::string short_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

std::string expect4(const char* a, std::int64_t av, const char* b, std::int64_t bv, const char* c,
                    std::int64_t cv, const char* d, std::int64_t dv) {
  auto f = [](const char* n, std::int64_t v) {
    return v >= 0 ? std::string(n) + "=" + std::to_string(v) : std::string(n);
  };
  std::string s = "[";
  s += f(a, av);
  s += ", ";
  s += f(b, bv);
  s += ", ";
  s += f(c, cv);
  s += ", ";
  s += f(d, dv);
  s += "]";
  return s;
}

}  // namespace

AttentionProblem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOptions& o, const OperationMetadata& md) {
  AttentionProblem p;
  // A per-call setting overrides the operator's metadata for this call.
  const std::optional<DType> runtime_dtype = o.runtime_dtype ? o.runtime_dtype : md.runtime_dtype;
  const std::optional<double> softmax_scale = o.softmax_scale ? o.softmax_scale : md.softmax_scale;
  const int num_threads = o.num_threads.value_or(md.num_threads);
  require_rank(q, "q", 4, "[B, Tq, Hq, D]");
  require_rank(k, "k", 4, "[B, Tk, Hkv, D]");
  require_rank(v, "v", 4, "[B, Tk, Hkv, Dv]");
  require_float(q, "q");
  require_float(k, "k");
  require_float(v, "v");
  p.B = q.dim(0), p.Tq = q.dim(1), p.Hq = q.dim(2), p.D = q.dim(3);
  p.Tk = k.dim(1), p.Hkv = k.dim(2), p.Dv = v.dim(3);
  if (p.D < 1) fail(ErrorCode::shape_mismatch, "q: head_dim D must be >= 1, got shape " + dims_string(q));
  if (p.Dv < 1) fail(ErrorCode::shape_mismatch, "v: head_dim Dv must be >= 1, got shape " + dims_string(v));
  if (p.Hq < 1) fail(ErrorCode::shape_mismatch, "q: Hq must be >= 1, got shape " + dims_string(q));
  if (p.Hkv < 1) fail(ErrorCode::shape_mismatch, "k: Hkv must be >= 1, got shape " + dims_string(k));
  if (k.dim(0) != p.B || k.dim(3) != p.D)
    fail(ErrorCode::shape_mismatch, "k: expected shape " + expect4("B", p.B, "Tk", -1, "Hkv", -1, "D", p.D) +
                                        " (B and D from q " + dims_string(q) + "), got " + dims_string(k));
  if (v.dim(0) != p.B || v.dim(1) != p.Tk || v.dim(2) != p.Hkv)
    fail(ErrorCode::shape_mismatch, "v: expected shape " +
                                        expect4("B", p.B, "Tk", p.Tk, "Hkv", p.Hkv, "Dv", -1) +
                                        " (from q and k), got " + dims_string(v));
  if (p.Hq % p.Hkv != 0)
    fail(ErrorCode::shape_mismatch, "k: Hq % Hkv must be 0 for GQA/MQA, got Hq=" + std::to_string(p.Hq) +
                                        " (q " + dims_string(q) + ") and Hkv=" + std::to_string(p.Hkv) +
                                        " (k " + dims_string(k) + ")");

  // Outputs must be allocatable before anything is copied or computed (a view may claim any
  // dimension: with zero strides a huge [.., Dv] costs nothing until the output is allocated).
  require_output_size("out", "[B, Tq, Hq, Dv]", {p.B, p.Tq, p.Hq, p.Dv}, 4, runtime_dtype.value_or(q.dtype()),
                      q, k, v);
  if (o.return_lse) require_output_size("lse", "[B, Hq, Tq]", {p.B, p.Hq, p.Tq, 0}, 3, DType::f32, q, k, v);
  if (o.return_weights)
    require_output_size("weights", "[B, Hq, Tq, Tk]", {p.B, p.Hq, p.Tq, p.Tk}, 4, DType::f32, q, k, v);

  // Storage dtype: the runtime dtype, or q's; k and v must agree unless a runtime dtype is set.
  if (runtime_dtype) {
    if (!is_float(*runtime_dtype))
      fail(ErrorCode::unsupported_dtype,
           "runtime_dtype: expected f32, f16 or bf16, got " + std::string(dtype_name(*runtime_dtype)));
    p.dtype = *runtime_dtype;
  } else {
    p.dtype = q.dtype();
    for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}})
      if (t->dtype() != p.dtype)
        fail(ErrorCode::unsupported_dtype,
             std::string(name) + ": dtype " + std::string(dtype_name(t->dtype())) + " differs from q's " +
                 std::string(dtype_name(p.dtype)) + " (set runtime_dtype to convert)");
  }
  if (md.runtime_softmax_dtype != DType::f32)
    fail(ErrorCode::unsupported_dtype, "runtime_softmax_dtype: only f32 is supported, got " +
                                           std::string(dtype_name(md.runtime_softmax_dtype)));
  // (p.owned grows only when an input is converted or copied: pointers into owned tensors stay
  // valid when it grows, their storage is on the heap and never moves.)
  p.q = normalised(p, q, p.dtype, "q");
  p.k = normalised(p, k, p.dtype, "k");
  p.v = normalised(p, v, p.dtype, "v");

  // Scale. The kernels compute scale * (q . k) in fp32: a scale that carries finite inputs past
  // FLT_MAX would turn every logit into +-inf (all-NaN or all-zero rows where the fp64 answer is
  // finite), so such a scale is refused. |q . k| <= D * max|q| * max|k| bounds the logits.
  if (softmax_scale) {
    if (!std::isfinite(*softmax_scale))
      fail(ErrorCode::invalid_argument,
           "softmax_scale: expected a finite number, got " + std::to_string(*softmax_scale));
    p.scale = *softmax_scale;
    // (Device tensors are not read on the host: their range is the caller's to keep.)
    if (std::fabs(p.scale) > 1.0 && !p.q.on_device() && !p.k.on_device()) {
      const double mq = max_abs_finite(p.q), mk = max_abs_finite(p.k);
      const double bound = std::fabs(p.scale) * static_cast<double>(p.D) * mq * mk;
      if (bound > std::numeric_limits<float>::max())
        fail(ErrorCode::invalid_argument, "softmax_scale: " + short_number(p.scale) +
                                              " can carry the logits out of the f32 range the kernels "
                                              "compute in: |scale| * D * max|q| * max|k| = " +
                                              short_number(p.scale) + " * " + std::to_string(p.D) + " * " +
                                              short_number(mq) + " * " + short_number(mk) + " = " +
                                              short_number(bound) + " > " +
                                              short_number(std::numeric_limits<float>::max()) +
                                              "; use a smaller scale or rescale q and k");
    }
  } else {
    p.scale = 1.0 / std::sqrt(static_cast<double>(p.D));
  }

  // Masks.
  p.causal = o.causal;
  Mask m = o.causal ? Mask::causal() : Mask::full();
  if (o.sliding_window) {
    const auto [l, r] = *o.sliding_window;
    if (l < 0 || r < 0 || l > kMaxExtent || r > kMaxExtent)
      fail(ErrorCode::invalid_argument,
           "sliding_window: expected (left, right) with 0 <= left, right <= 2^40, got (" + std::to_string(l) +
               ", " + std::to_string(r) + ")");
    p.window = o.sliding_window;
    m = m & Mask::local(l, r);
  }
  if (o.chunk_size) {
    if (*o.chunk_size < 1 || *o.chunk_size > kMaxExtent)
      fail(ErrorCode::invalid_argument,
           "chunk_size: expected an integer >= 1, got " + std::to_string(*o.chunk_size));
    p.chunk = o.chunk_size;
    m = m & Mask::chunked_causal(*o.chunk_size);
  }
  if (o.mask) {
    if (o.mask->head_dependent() && o.mask->num_heads() != p.Hq)
      fail(ErrorCode::shape_mismatch, "mask: a per-head mask needs one mask per q head: expected " +
                                          std::to_string(p.Hq) + " heads (Hq), got " +
                                          std::to_string(o.mask->num_heads()));
    p.user_mask = o.mask;
    m = m & *o.mask;
  }
  p.mask = m;

  // Segment ids.
  if (o.segment_ids_q.has_value() != o.segment_ids_kv.has_value())
    fail(ErrorCode::invalid_argument, std::string(o.segment_ids_q ? "segment_ids_kv" : "segment_ids_q") +
                                          ": segment ids must be given for both q and kv, or for neither");
  if (o.segment_ids_q) {
    for (auto [t, name, T, tn] : {std::tuple{&*o.segment_ids_q, "segment_ids_q", p.Tq, "Tq"},
                                  std::tuple{&*o.segment_ids_kv, "segment_ids_kv", p.Tk, "Tk"}}) {
      if (t->rank() != 2 || t->dim(0) != p.B || t->dim(1) != T)
        fail(ErrorCode::shape_mismatch, std::string(name) + ": expected shape [B=" + std::to_string(p.B) +
                                            ", " + tn + "=" + std::to_string(T) + "], got " +
                                            dims_string(*t));
      if (t->dtype() != DType::i32 && t->dtype() != DType::i64)
        fail(ErrorCode::unsupported_dtype,
             std::string(name) + ": expected dtype i32 or i64, got " + std::string(dtype_name(t->dtype())));
    }
    p.seg_q = static_cast<const std::int32_t*>(contiguous(p, *o.segment_ids_q, DType::i32, "segment_ids_q"));
    p.seg_kv =
        static_cast<const std::int32_t*>(contiguous(p, *o.segment_ids_kv, DType::i32, "segment_ids_kv"));
  }

  // Bias [B|1, Hq|1, Tq, Tk].
  if (o.bias) {
    const TensorView& b = *o.bias;
    if (!is_float(b.dtype()))
      fail(ErrorCode::unsupported_dtype,
           "bias: expected a float dtype (f32, f16 or bf16), got " + std::string(dtype_name(b.dtype())));
    if (b.rank() != 4 || (b.dim(0) != 1 && b.dim(0) != p.B) || (b.dim(1) != 1 && b.dim(1) != p.Hq) ||
        b.dim(2) != p.Tq || b.dim(3) != p.Tk)
      fail(ErrorCode::shape_mismatch, "bias: expected shape [B=" + std::to_string(p.B) + " or 1, Hq=" +
                                          std::to_string(p.Hq) + " or 1, Tq=" + std::to_string(p.Tq) +
                                          ", Tk=" + std::to_string(p.Tk) + "], got " + dims_string(b));
    p.bias = static_cast<const float*>(contiguous(p, b, DType::f32, "bias"));
    p.bias_stride_h = b.dim(1) == 1 ? 0 : p.Tq * p.Tk;
    p.bias_stride_b = b.dim(0) == 1 ? 0 : b.dim(1) * p.Tq * p.Tk;
  }

  // Soft cap: the kernels evaluate cap * tanh(s / cap) in fp32, so cap must be a normal f32
  // (a cap beyond FLT_MAX rounds to inf and gives inf * 0 = NaN; below FLT_MIN, 1 / cap
  // overflows).
  if (o.logits_soft_cap) {
    const double cap = *o.logits_soft_cap;
    if (!std::isfinite(cap) || cap < std::numeric_limits<float>::min() ||
        cap > std::numeric_limits<float>::max())
      fail(ErrorCode::invalid_argument, "logits_soft_cap: expected a number in the normal f32 range [" +
                                            short_number(std::numeric_limits<float>::min()) + ", " +
                                            short_number(std::numeric_limits<float>::max()) + "], got " +
                                            short_number(cap));
    p.soft_cap = o.logits_soft_cap;
  }

  // Sinks [Hq].
  if (const std::optional<TensorView>& sinks = sinks_option(o.sinks, o.softmax_aux)) {
    const TensorView& s = *sinks;
    check_sinks(s, p.Hq, /*host_only=*/false);
    p.sinks = static_cast<const float*>(contiguous(p, s, DType::f32, "sinks (softmax_aux)"));
  }

  p.want_lse = o.return_lse;
  p.want_weights = o.return_weights;
  p.profile = o.profile || environment().profile;

  // Block sizes and threads.
  for (auto [bs, name] : {std::pair{md.blocksize_q, "blocksize_q"}, std::pair{md.blocksize_k, "blocksize_k"}})
    if (bs && (*bs < 1 || *bs > 8192))
      fail(ErrorCode::invalid_argument, std::string(name) + ": expected 1..8192, got " + std::to_string(*bs));
  p.blocksize_q = md.blocksize_q.value_or(128);
  p.blocksize_k = md.blocksize_k.value_or(128);
  if (num_threads < 0)
    fail(ErrorCode::invalid_argument,
         "num_threads: expected >= 0 (0 = OpenMP default), got " + std::to_string(num_threads));
  // More threads than the hardware has only costs (and an absurd count overflows OpenMP's
  // thread stacks): clamp, here, for every backend and every source of the setting.
  p.num_threads = std::min(num_threads, max_worker_threads());
  return p;
}

int max_worker_threads() {
  static const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return n;
}

AttentionBuffers allocate_buffers(const AttentionProblem& p) {
  AttentionBuffers b;
  if (!p.q.on_device()) b.out = Tensor(p.dtype, {p.B, p.Tq, p.Hq, p.Dv});
  if (p.want_lse) b.lse = Tensor(DType::f32, {p.B, p.Hq, p.Tq});
  if (p.want_weights) b.weights = Tensor(DType::f32, {p.B, p.Hq, p.Tq, p.Tk});
  return b;
}

double attention_flops(const AttentionProblem& p, double visible_pairs_per_head) {
  return 2.0 * static_cast<double>(p.D + p.Dv) * visible_pairs_per_head * static_cast<double>(p.B * p.Hq);
}

}  // namespace attnops
