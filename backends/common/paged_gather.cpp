#include "backends/common/paged_gather.h"

#include <cstring>
#include <vector>

#include "attnops/error.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "attnops/kv_quant.h"

namespace attnops::paged {

namespace {

using i64 = std::int64_t;

// Rows [lo, hi) of one pool into dst [hi - lo, H, Dh] (contiguous): whole page runs with one
// memcpy when the pool's rows are dense, else one per (row, head).
void gather_pool(const TensorView& pool, const std::int32_t* pages, i64 lo, i64 hi, char* dst) {
  const i64 es = static_cast<i64>(dtype_size(pool.dtype()));
  const i64 ps = pool.dim(1), H = pool.dim(2), Dh = pool.dim(3), row = H * Dh * es;
  const bool dense_rows = (pool.stride(2) == Dh || H == 1) && (pool.stride(1) == H * Dh || ps == 1);
  const auto* base = static_cast<const char*>(pool.data());
  for (i64 j = lo; j < hi;) {
    const i64 page = pages[j / ps], r = j % ps;
    const char* src = base + (page * pool.stride(0) + r * pool.stride(1)) * es;
    if (dense_rows) {
      const i64 n = std::min(ps - r, hi - j);
      std::memcpy(dst, src, static_cast<std::size_t>(n * row));
      dst += n * row;
      j += n;
      continue;
    }
    for (i64 h = 0; h < H; ++h)
      std::memcpy(dst + h * Dh * es, src + h * pool.stride(2) * es, static_cast<std::size_t>(Dh * es));
    dst += row;
    ++j;
  }
}

// Rows [lo, hi) of an 8-bit pool into dst [hi - lo, H, Dh] of dtype `as`: each (row, head)'s codes
// times its scale (per token: scales [P, page, H] with strides; per tensor: `tensor_scale`), in
// f32, rounded to `as`.
void dequantize_pool(const TensorView& pool, const TensorView& scales, float tensor_scale,
                     const std::int32_t* pages, i64 lo, i64 hi, DType as, char* dst) {
  const i64 ps = pool.dim(1), H = pool.dim(2), Dh = pool.dim(3);
  const DType t = pool.dtype();
  float value[256];  // each code's exact value
  for (int b = 0; b < 256; ++b) value[b] = kv_dequantize(t, static_cast<std::uint8_t>(b), 1.f);
  const auto* base = static_cast<const std::uint8_t*>(pool.data());
  const float* sbase = scales.empty() ? nullptr : scales.data_as<float>();
  const i64 es = static_cast<i64>(dtype_size(as));
  for (i64 j = lo; j < hi; ++j) {
    const i64 page = pages[j / ps], r = j % ps;
    for (i64 h = 0; h < H; ++h) {
      const std::uint8_t* c = base + page * pool.stride(0) + r * pool.stride(1) + h * pool.stride(2);
      const float sc =
          sbase ? sbase[page * scales.stride(0) + r * scales.stride(1) + h * scales.stride(2)] : tensor_scale;
      if (as == DType::f32) {
        float* o = reinterpret_cast<float*>(dst);
        for (i64 e = 0; e < Dh; ++e) o[e] = value[c[e]] * sc;
      } else if (as == DType::bf16) {
        auto* o = reinterpret_cast<std::uint16_t*>(dst);
        for (i64 e = 0; e < Dh; ++e) o[e] = float_to_bf16_bits(value[c[e]] * sc);
      } else {
        auto* o = reinterpret_cast<std::uint16_t*>(dst);
        for (i64 e = 0; e < Dh; ++e) o[e] = float_to_half_bits(value[c[e]] * sc);
      }
      dst += Dh * es;
    }
  }
}

}  // namespace

DenseSequence dense_sequence(const PagedProblem& p, std::int64_t s, std::int64_t first, bool gather,
                             std::optional<DType> as) {
  if (p.on_device())
    throw Error(ErrorCode::invalid_argument, "paged: a device-resident input reached a host kernel");
  const PagedPlanData& d = *p.batch;
  const auto si = static_cast<std::size_t>(s);
  const i64 kv = d.kv_len[si], ql = d.q_len[si], T = kv - first;
  const DType kt = as.value_or(p.dtype);
  if (!p.quantized() && kt != p.kv_dtype)
    throw Error(ErrorCode::invalid_argument, "paged: a float cache's keys are gathered in its own dtype");
  DenseSequence x;
  x.first = first;
  x.k = Tensor(kt, {1, T, p.Hkv, p.D});
  x.v = Tensor(kt, {1, T, p.Hkv, p.Dv});
  if (gather) gather_rows(p, s, x, 0, T);
  const i64 es = static_cast<i64>(dtype_size(p.dtype));
  x.q = TensorView(static_cast<const char*>(p.q.data()) + d.q_begin[si] * p.q.stride(0) * es, p.dtype,
                   {1, ql, p.Hq, p.D}, {ql * p.q.stride(0), p.q.stride(0), p.q.stride(1), 1});
  if (kt != p.dtype) {
    x.q_copy = Tensor::copy_of(x.q, kt);
    x.q = x.q_copy;
  }
  x.options.causal = d.causal;
  x.options.sliding_window = d.window;
  x.options.chunk_size = d.chunk;
  x.options.logits_soft_cap = p.soft_cap;
  if (p.sinks) x.options.sinks = TensorView(p.sinks, DType::f32, {p.Hq});
  x.options.return_lse = p.want_lse;
  x.metadata.softmax_scale = p.scale;
  x.metadata.num_threads = p.num_threads;
  return x;
}

void gather_rows(const PagedProblem& p, std::int64_t s, DenseSequence& x, std::int64_t lo, std::int64_t hi) {
  const PagedPlanData& d = *p.batch;
  const std::int32_t* pages = d.page_ids.data() + d.page_begin[static_cast<std::size_t>(s)];
  const i64 es = static_cast<i64>(dtype_size(x.k.dtype()));
  char* k = static_cast<char*>(x.k.data()) + lo * p.Hkv * p.D * es;
  char* v = static_cast<char*>(x.v.data()) + lo * p.Hkv * p.Dv * es;
  if (p.quantized()) {
    dequantize_pool(p.k_pages, p.k_scales, p.k_scale, pages, x.first + lo, x.first + hi, x.k.dtype(), k);
    dequantize_pool(p.v_pages, p.v_scales, p.v_scale, pages, x.first + lo, x.first + hi, x.v.dtype(), v);
    return;
  }
  gather_pool(p.k_pages, pages, x.first + lo, x.first + hi, k);
  gather_pool(p.v_pages, pages, x.first + lo, x.first + hi, v);
}

void scatter_outputs(const PagedProblem& p, std::int64_t s, const AttentionBuffers& dense,
                     PagedBuffers& out) {
  scatter_rows(p, s, dense, out, 0, (*p.batch).q_len[static_cast<std::size_t>(s)]);
}

void scatter_rows(const PagedProblem& p, std::int64_t s, const AttentionBuffers& dense, PagedBuffers& out,
                  std::int64_t lo, std::int64_t hi) {
  const PagedPlanData& d = *p.batch;
  const auto si = static_cast<std::size_t>(s);
  const i64 q0 = d.q_begin[si], ql = d.q_len[si];
  const i64 elems = p.Hq * p.Dv, row = elems * static_cast<i64>(dtype_size(p.dtype));
  // [1, q_len, Hq, Dv] and rows [q0, q0 + q_len) of [N, Hq, Dv] have the same layout.
  if (dense.out.dtype() == p.dtype) {
    std::memcpy(static_cast<char*>(out.out.data()) + (q0 + lo) * row,
                static_cast<const char*>(dense.out.data()) + lo * row,
                static_cast<std::size_t>((hi - lo) * row));
  } else {  // an f32 result (the oracle over an 8-bit cache) rounded to q's dtype
    const float* f = dense.out.data_as<float>() + lo * elems;
    char* to = static_cast<char*>(out.out.data()) + (q0 + lo) * row;
    for (i64 i = 0; i < (hi - lo) * elems; ++i)
      store_from_float(to, p.dtype, static_cast<std::size_t>(i), f[i]);
  }
  if (out.lse && dense.lse) {
    const float* l = dense.lse->data_as<float>();
    float* o = out.lse->data_as<float>();
    for (i64 i = lo; i < hi; ++i)
      for (i64 h = 0; h < p.Hq; ++h) o[(q0 + i) * p.Hq + h] = l[h * ql + i];
  }
}

}  // namespace attnops::paged
