// make_problem: validation of one call's inputs and their normalisation for the kernels.
#include "attnops/problem.h"

#include <cstdlib>
#include <string_view>

#include <cmath>
#include <limits>

#include "attnops/error.h"

namespace attnops {

namespace {

// Largest window / chunk we accept: keeps p - L and p + R far from int64 overflow.
constexpr std::int64_t kMaxExtent = std::int64_t{1} << 40;

[[noreturn]] void fail(ErrorCode code, const std::string& msg) { throw Error(code, msg); }

std::string dims_string(const TensorView& t) { return shape_string(t.shape()); }

void require_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  if (t.data() == nullptr && !t.on_device() && t.numel() != 0)
    fail(ErrorCode::invalid_argument, std::string(name) + ": null data pointer");
  if (t.rank() != rank)
    fail(ErrorCode::shape_mismatch, std::string(name) + ": expected rank " + std::to_string(rank) + " " + layout +
                                        ", got rank " + std::to_string(t.rank()) + " " + dims_string(t));
}

void require_float(const TensorView& t, const char* name) {
  if (!is_float(t.dtype()))
    fail(ErrorCode::unsupported_dtype, std::string(name) + ": expected a float dtype (f32, f16 or bf16), got " +
                                           std::string(dtype_name(t.dtype())));
}

// A view with stride(last) == 1, copying (into p.owned) when the view is not, or converting
// to `dtype` when it differs.
TensorView normalised(AttentionProblem& p, const TensorView& t, DType dtype) {
  if (t.dtype() == dtype && (t.rank() == 0 || t.stride(t.rank() - 1) == 1 || t.dim(t.rank() - 1) <= 1)) return t;
  if (t.on_device())
    fail(ErrorCode::unsupported_dtype, "a device tensor " + dims_string(t) + " in " + std::string(dtype_name(t.dtype())) +
                                           " would need a conversion to " + std::string(dtype_name(dtype)) +
                                           " or a copy (innermost stride != 1) on the host: make it in the runtime "
                                           "dtype, contiguous in its last dimension");
  p.owned.push_back(Tensor::copy_of(t, dtype));
  return p.owned.back().view();
}

const void* contiguous(AttentionProblem& p, const TensorView& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t.data();
  p.owned.push_back(Tensor::copy_of(t, dtype));
  return p.owned.back().data();
}

std::string expect4(const char* a, std::int64_t av, const char* b, std::int64_t bv, const char* c, std::int64_t cv,
                    const char* d, std::int64_t dv) {
  auto f = [](const char* n, std::int64_t v) { return v >= 0 ? std::string(n) + "=" + std::to_string(v) : std::string(n); };
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
    fail(ErrorCode::shape_mismatch, "v: expected shape " + expect4("B", p.B, "Tk", p.Tk, "Hkv", p.Hkv, "Dv", -1) +
                                        " (from q and k), got " + dims_string(v));
  if (p.Hq % p.Hkv != 0)
    fail(ErrorCode::shape_mismatch, "k: Hq % Hkv must be 0 for GQA/MQA, got Hq=" + std::to_string(p.Hq) +
                                        " (q " + dims_string(q) + ") and Hkv=" + std::to_string(p.Hkv) + " (k " +
                                        dims_string(k) + ")");

  // Storage dtype: the runtime dtype, or q's; k and v must agree unless a runtime dtype is set.
  if (md.runtime_dtype) {
    if (!is_float(*md.runtime_dtype))
      fail(ErrorCode::unsupported_dtype, "runtime_dtype: expected f32, f16 or bf16, got " +
                                             std::string(dtype_name(*md.runtime_dtype)));
    p.dtype = *md.runtime_dtype;
  } else {
    p.dtype = q.dtype();
    for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}})
      if (t->dtype() != p.dtype)
        fail(ErrorCode::unsupported_dtype, std::string(name) + ": dtype " + std::string(dtype_name(t->dtype())) +
                                               " differs from q's " + std::string(dtype_name(p.dtype)) +
                                               " (set runtime_dtype to convert)");
  }
  if (md.runtime_softmax_dtype != DType::f32)
    fail(ErrorCode::unsupported_dtype, "runtime_softmax_dtype: only f32 is supported, got " +
                                           std::string(dtype_name(md.runtime_softmax_dtype)));
  p.owned.reserve(8);  // pointers into owned tensors stay valid: storage is heap, never moved
  p.q = normalised(p, q, p.dtype);
  p.k = normalised(p, k, p.dtype);
  p.v = normalised(p, v, p.dtype);

  // Scale.
  if (md.softmax_scale) {
    if (!std::isfinite(*md.softmax_scale))
      fail(ErrorCode::invalid_argument, "softmax_scale: expected a finite number, got " +
                                            std::to_string(*md.softmax_scale));
    p.scale = *md.softmax_scale;
  } else {
    p.scale = 1.0 / std::sqrt(static_cast<double>(p.D));
  }

  // Masks.
  p.causal = o.causal;
  Mask m = o.causal ? Mask::causal() : Mask::full();
  if (o.sliding_window) {
    const auto [l, r] = *o.sliding_window;
    if (l < 0 || r < 0 || l > kMaxExtent || r > kMaxExtent)
      fail(ErrorCode::invalid_argument, "sliding_window: expected (left, right) with 0 <= left, right <= 2^40, got (" +
                                            std::to_string(l) + ", " + std::to_string(r) + ")");
    p.window = o.sliding_window;
    m = m & Mask::local(l, r);
  }
  if (o.chunk_size) {
    if (*o.chunk_size < 1 || *o.chunk_size > kMaxExtent)
      fail(ErrorCode::invalid_argument, "chunk_size: expected an integer >= 1, got " + std::to_string(*o.chunk_size));
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
        fail(ErrorCode::shape_mismatch, std::string(name) + ": expected shape [B=" + std::to_string(p.B) + ", " + tn +
                                            "=" + std::to_string(T) + "], got " + dims_string(*t));
      if (t->dtype() != DType::i32 && t->dtype() != DType::i64)
        fail(ErrorCode::unsupported_dtype, std::string(name) + ": expected dtype i32 or i64, got " +
                                               std::string(dtype_name(t->dtype())));
    }
    p.seg_q = static_cast<const std::int32_t*>(contiguous(p, *o.segment_ids_q, DType::i32));
    p.seg_kv = static_cast<const std::int32_t*>(contiguous(p, *o.segment_ids_kv, DType::i32));
  }

  // Bias [B|1, Hq|1, Tq, Tk].
  if (o.bias) {
    const TensorView& b = *o.bias;
    if (!is_float(b.dtype()))
      fail(ErrorCode::unsupported_dtype, "bias: expected a float dtype (f32, f16 or bf16), got " +
                                             std::string(dtype_name(b.dtype())));
    if (b.rank() != 4 || (b.dim(0) != 1 && b.dim(0) != p.B) || (b.dim(1) != 1 && b.dim(1) != p.Hq) ||
        b.dim(2) != p.Tq || b.dim(3) != p.Tk)
      fail(ErrorCode::shape_mismatch, "bias: expected shape [B=" + std::to_string(p.B) + " or 1, Hq=" +
                                          std::to_string(p.Hq) + " or 1, Tq=" + std::to_string(p.Tq) + ", Tk=" +
                                          std::to_string(p.Tk) + "], got " + dims_string(b));
    p.bias = static_cast<const float*>(contiguous(p, b, DType::f32));
    p.bias_stride_h = b.dim(1) == 1 ? 0 : p.Tq * p.Tk;
    p.bias_stride_b = b.dim(0) == 1 ? 0 : b.dim(1) * p.Tq * p.Tk;
  }

  // Soft cap.
  if (o.logits_soft_cap) {
    if (!std::isfinite(*o.logits_soft_cap) || *o.logits_soft_cap <= 0)
      fail(ErrorCode::invalid_argument, "logits_soft_cap: expected a finite number > 0, got " +
                                            std::to_string(*o.logits_soft_cap));
    p.soft_cap = o.logits_soft_cap;
  }

  // Sinks [Hq].
  if (o.softmax_aux) {
    const TensorView& s = *o.softmax_aux;
    if (!is_float(s.dtype()))
      fail(ErrorCode::unsupported_dtype, "softmax_aux: expected a float dtype, got " + std::string(dtype_name(s.dtype())));
    if (s.rank() != 1 || s.dim(0) != p.Hq)
      fail(ErrorCode::shape_mismatch, "softmax_aux: expected shape [Hq=" + std::to_string(p.Hq) +
                                          "] (one sink logit per q head), got " + dims_string(s));
    p.sinks = static_cast<const float*>(contiguous(p, s, DType::f32));
  }

  p.want_lse = o.return_lse;
  p.want_weights = o.return_weights;
  if (const char* prof = std::getenv("ATTNOPS_PROFILE"))
    p.profile = o.profile || (*prof != '\0' && std::string_view(prof) != "0" && std::string_view(prof) != "false");
  else
    p.profile = o.profile;

  // Block sizes and threads.
  for (auto [bs, name] : {std::pair{md.blocksize_q, "blocksize_q"}, std::pair{md.blocksize_k, "blocksize_k"}})
    if (bs && (*bs < 1 || *bs > 8192))
      fail(ErrorCode::invalid_argument, std::string(name) + ": expected 1..8192, got " + std::to_string(*bs));
  p.blocksize_q = md.blocksize_q.value_or(128);
  p.blocksize_k = md.blocksize_k.value_or(128);
  if (md.num_threads < 0)
    fail(ErrorCode::invalid_argument, "num_threads: expected >= 0 (0 = OpenMP default), got " +
                                          std::to_string(md.num_threads));
  p.num_threads = md.num_threads;
  return p;
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
