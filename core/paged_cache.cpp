// PagedKVCache: the two page pools (and an 8-bit cache's scales), their views, write() (vLLM's
// reshape_and_cache semantics, all or nothing) and gather() (one sequence as dense tensors).
//
// Pool layout: k [P, page_size, Hkv, D], v [P, page_size, Hkv, Dv]; slot = page * page_size +
// row. Per-token scale pools [P, page_size, Hkv] are handled as pools [P, page_size, Hkv, 1], so
// one copy routine serves all four. Host pools are written with memcpy per (row, head); device
// pools through the storage's write(): byte runs of consecutive slots, one submission per pool
// (existing DeviceStorage copies, no shader).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attnops/error.h"
#include "attnops/ext/device_storage.h"
#include "attnops/kv_quant.h"
#include "attnops/paged.h"
#include "core/checked_size.h"
#include "core/paged_index.h"
#include "core/paged_quant.h"

namespace attnops {

namespace {

using i64 = std::int64_t;

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, msg);
}

// What a cache built from storage keeps alive.
struct PoolHolder {
  Tensor k, v, ks, vs;
  DeviceTensor dk, dv, dks, dvs;
};

// The spec two pool views describe; Error naming the pool otherwise.
PagedKVSpec spec_of(const TensorView& k, const TensorView& v) {
  for (auto [t, name, layout] : {std::tuple{&k, "k_pages", "[num_pages, page_size, Hkv, D]"},
                                 std::tuple{&v, "v_pages", "[num_pages, page_size, Hkv, Dv]"}}) {
    if (t->rank() != 4)
      fail(ErrorCode::shape_mismatch,
           std::string(name) + ": expected rank 4 " + layout + ", got " + shape_string(t->shape()));
    if (!is_float(t->dtype()) && !is_kv8(t->dtype()))
      fail(ErrorCode::unsupported_dtype, std::string(name) +
                                             ": expected f32, f16, bf16, int8 or fp8_e4m3, got " +
                                             std::string(dtype_name(t->dtype())));
    if (t->stride(3) != 1 && t->dim(3) > 1)
      fail(ErrorCode::invalid_argument,
           std::string(name) + ": the innermost dimension must be contiguous (stride 1), got stride " +
               std::to_string(t->stride(3)));
    if (t->data() == nullptr && !t->on_device() && t->numel() != 0)
      fail(ErrorCode::invalid_argument, std::string(name) + ": null data pointer");
  }
  if (v.dim(0) != k.dim(0) || v.dim(1) != k.dim(1) || v.dim(2) != k.dim(2))
    fail(ErrorCode::shape_mismatch, "v_pages: expected shape [num_pages=" + std::to_string(k.dim(0)) +
                                        ", page_size=" + std::to_string(k.dim(1)) +
                                        ", Hkv=" + std::to_string(k.dim(2)) + ", Dv] (from k_pages " +
                                        shape_string(k.shape()) + "), got " + shape_string(v.shape()));
  if (v.dtype() != k.dtype())
    fail(ErrorCode::unsupported_dtype, "v_pages: dtype " + std::string(dtype_name(v.dtype())) +
                                           " differs from k_pages' " + std::string(dtype_name(k.dtype())));
  if (k.on_device() != v.on_device())
    fail(ErrorCode::invalid_argument, "v_pages: one pool is on the device and the other on the host");
  PagedKVSpec s{k.dim(0), k.dim(1), k.dim(2), k.dim(3), v.dim(3), k.dtype()};
  paged_index::check_spec(s);
  return s;
}

// A per-token scale pool [P, page, H] as a pool [P, page, H, 1].
TensorView as_pool4(const TensorView& s) {
  const std::vector<i64> shape{s.dim(0), s.dim(1), s.dim(2), 1};
  const std::vector<i64> strides{s.stride(0), s.stride(1), s.stride(2), 1};
  if (s.on_device()) return TensorView(s.device_storage(), s.device_offset(), s.dtype(), shape, strides);
  return TensorView(s.data(), s.dtype(), shape, strides);
}

// The values of a view on the device, as a host f32 tensor of its shape.
Tensor read_device_f32(const TensorView& s) {
  std::int64_t lo = s.device_offset(), hi = lo + 1;  // the element range the view covers
  for (int i = 0; i < s.rank(); ++i) hi += (s.dim(i) - 1) * s.stride(i);
  std::vector<float> all(static_cast<std::size_t>(hi - lo));
  DeviceStorage::Copy c;
  c.device_offset = static_cast<std::size_t>(lo) * 4u;
  c.bytes = all.size() * 4u;
  c.dst = all.data();
  s.device_storage()->read({c});
  Tensor t(DType::f32, s.shape());
  std::vector<i64> idx(static_cast<std::size_t>(s.rank()), 0);
  for (i64 o = 0; o < t.numel(); ++o) {
    i64 off = 0;
    for (int i = 0; i < s.rank(); ++i) off += idx[static_cast<std::size_t>(i)] * s.stride(i);
    t.data_as<float>()[o] = all[static_cast<std::size_t>(off)];
    for (int i = s.rank() - 1; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < s.dim(i)) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
  }
  return t;
}

// A rank-3 view of one page of a pool.
TensorView page_view(const TensorView& pool, i64 page) {
  const std::vector<i64> shape{pool.dim(1), pool.dim(2), pool.dim(3)};
  const std::vector<i64> strides{pool.stride(1), pool.stride(2), pool.stride(3)};
  const i64 off = page * pool.stride(0);
  if (pool.on_device())
    return TensorView(pool.device_storage(), pool.device_offset() + off, pool.dtype(), shape, strides);
  return TensorView(static_cast<const char*>(pool.data()) + off * static_cast<i64>(dtype_size(pool.dtype())),
                    pool.dtype(), shape, strides);
}

// New rows as a contiguous [N, H, Dh] host tensor view in `dtype` (a converted or packed copy
// into `keep` when needed), checked against the cache.
TensorView rows_in(const TensorView& x, const char* name, i64 H, i64 Dh, const char* dname, DType dtype,
                   std::vector<Tensor>& keep) {
  if (x.on_device())
    fail(ErrorCode::invalid_argument, std::string(name) +
                                          ": a device tensor; write() takes the new rows from "
                                          "host memory (copy them with DeviceTensor::to_host())");
  if (x.rank() != 3 || x.dim(1) != H || x.dim(2) != Dh)
    fail(ErrorCode::shape_mismatch, std::string(name) + ": expected shape [N, Hkv=" + std::to_string(H) +
                                        ", " + dname + "=" + std::to_string(Dh) + "] (from the cache), got " +
                                        shape_string(x.shape()));
  if (!is_float(x.dtype()))
    fail(ErrorCode::unsupported_dtype,
         std::string(name) + ": expected f32, f16 or bf16, got " + std::string(dtype_name(x.dtype())));
  if (x.data() == nullptr && x.numel() != 0)
    fail(ErrorCode::invalid_argument, std::string(name) + ": null data pointer");
  if (is_kv8(dtype) || (x.dtype() == dtype && x.is_contiguous())) return x;  // 8-bit: quantized later
  keep.push_back(Tensor::copy_of(x, dtype));
  return keep.back().view();
}

// Appends the device copies that put rows (with slot >= 0) of `src` [N, H, Dh] (contiguous) into
// `pool`: one copy per run of rows whose slots are consecutive within one page when the pool's
// rows are contiguous ([H, Dh] dense, page rows H * Dh apart), else one per (row, head).
void device_copies(const TensorView& pool, const TensorView& src, const std::vector<i64>& slots,
                   std::vector<DeviceStorage::Copy>& out) {
  const i64 es = static_cast<i64>(dtype_size(pool.dtype()));
  const i64 ps = pool.dim(1), H = pool.dim(2), Dh = pool.dim(3), row = H * Dh;
  const bool dense_rows = (pool.stride(2) == Dh || H == 1) && (pool.stride(1) == row || ps == 1);
  const auto* base = static_cast<const std::byte*>(src.data());
  const i64 n = static_cast<i64>(slots.size());
  for (i64 t = 0; t < n;) {
    const i64 slot = slots[static_cast<std::size_t>(t)];
    if (slot < 0) {
      ++t;
      continue;
    }
    const i64 page = slot / ps, r = slot % ps;
    if (!dense_rows) {
      for (i64 h = 0; h < H; ++h) {
        DeviceStorage::Copy c;
        c.device_offset = static_cast<std::size_t>(
            (pool.device_offset() + page * pool.stride(0) + r * pool.stride(1) + h * pool.stride(2)) * es);
        c.bytes = static_cast<std::size_t>(Dh * es);
        c.src = base + (t * row + h * Dh) * es;
        out.push_back(c);
      }
      ++t;
      continue;
    }
    i64 len = 1;  // rows t + len continue the run: the next slot, same page
    while (t + len < n && slots[static_cast<std::size_t>(t + len)] == slot + len && r + len < ps) ++len;
    DeviceStorage::Copy c;
    c.device_offset =
        static_cast<std::size_t>((pool.device_offset() + page * pool.stride(0) + r * pool.stride(1)) * es);
    c.bytes = static_cast<std::size_t>(len * row * es);
    c.src = base + t * row * es;
    out.push_back(c);
    t += len;
  }
}

void host_write(const TensorView& pool, const TensorView& src, const std::vector<i64>& slots) {
  const i64 es = static_cast<i64>(dtype_size(pool.dtype()));
  const i64 ps = pool.dim(1), H = pool.dim(2), Dh = pool.dim(3);
  // The cache owns (or was handed, by wrap()) this memory for writing; TensorView is a read view.
  auto* dst = static_cast<char*>(const_cast<void*>(pool.data()));
  const auto* s = static_cast<const char*>(src.data());
  for (std::size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    const i64 page = slots[t] / ps, r = slots[t] % ps;
    for (i64 h = 0; h < H; ++h)
      std::memcpy(dst + (page * pool.stride(0) + r * pool.stride(1) + h * pool.stride(2)) * es,
                  s + ((static_cast<i64>(t) * H + h) * Dh) * es, static_cast<std::size_t>(Dh * es));
  }
}

// The scales a cache over pools of `spec` is given: none for float pools; for 8-bit ones both,
// f32, [P, page, Hkv] (per token, where the pools are) or one value (per tensor), every value
// valid. Error naming the scale otherwise.
struct Scales {
  KVScales kind = KVScales::per_token;
  TensorView k, v;  // per token
  KVTensorScales tensor;
};
Scales scales_of(const PagedKVSpec& spec, bool pools_on_device, const TensorView& ks, const TensorView& vs) {
  Scales out;
  if (!spec.quantized()) {
    for (auto [t, name] : {std::pair{&ks, "k_scales"}, std::pair{&vs, "v_scales"}})
      if (!t->empty())
        fail(ErrorCode::invalid_argument, std::string(name) + ": a " + std::string(dtype_name(spec.dtype)) +
                                              " cache takes no scales (only int8 and fp8_e4m3 caches do)");
    return out;
  }
  const std::string want = "[num_pages=" + std::to_string(spec.num_pages) +
                           ", page_size=" + std::to_string(spec.page_size) +
                           ", Hkv=" + std::to_string(spec.num_kv_heads) + "] (per token) or [1] (per tensor)";
  bool per_tensor[2] = {false, false};
  int i = 0;
  for (auto [t, name] : {std::pair{&ks, "k_scales"}, std::pair{&vs, "v_scales"}}) {
    if (t->empty())
      fail(ErrorCode::invalid_argument, std::string(name) + ": an " + std::string(dtype_name(spec.dtype)) +
                                            " cache needs its scales, f32 " + want);
    if (t->dtype() != DType::f32)
      fail(ErrorCode::unsupported_dtype,
           std::string(name) + ": expected f32 scales, got " + std::string(dtype_name(t->dtype())));
    const bool token = t->rank() == 3 && t->dim(0) == spec.num_pages && t->dim(1) == spec.page_size &&
                       t->dim(2) == spec.num_kv_heads;
    const bool tensor = t->numel() == 1 && t->rank() <= 1;
    if (!token && !tensor)
      fail(ErrorCode::shape_mismatch,
           std::string(name) + ": expected shape " + want + ", got " + shape_string(t->shape()));
    if (token && t->on_device() != pools_on_device)
      fail(ErrorCode::invalid_argument, std::string(name) +
                                            ": per-token scales must live where the pools do (" +
                                            (pools_on_device ? "the device" : "the host") + ")");
    if (!t->on_device() && t->data() == nullptr)
      fail(ErrorCode::invalid_argument, std::string(name) + ": null data pointer");
    per_tensor[i++] = tensor;
  }
  if (per_tensor[0] != per_tensor[1])
    fail(ErrorCode::invalid_argument,
         std::string(per_tensor[1] ? "v_scales" : "k_scales") +
             ": one scale per tensor while the other pool's scales are per token "
             "(both pools take the same kind)");
  out.kind = per_tensor[0] ? KVScales::per_tensor : KVScales::per_token;
  for (auto [t, name, value] :
       {std::tuple{&ks, "k_scales", &out.tensor.k}, std::tuple{&vs, "v_scales", &out.tensor.v}}) {
    Tensor host;
    const TensorView view = t->on_device() ? TensorView(host = read_device_f32(*t)) : *t;
    paged_quant::check_scales(view, spec.dtype, name);
    if (out.kind == KVScales::per_tensor) *value = view.data_as<float>()[0];
  }
  if (out.kind == KVScales::per_token) out.k = ks, out.v = vs;
  return out;
}

}  // namespace

namespace {
// A float spec's scales field means nothing: normalised so that caches compare by what matters.
PagedKVSpec normalised(PagedKVSpec s) {
  if (!s.quantized()) s.scales = KVScales::per_token;
  return s;
}
// The scales host() / device() start with: per token 1, per tensor the given ones.
void check_tensor_scales(const PagedKVSpec& spec, const std::optional<KVTensorScales>& ts) {
  if (ts && (!spec.quantized() || spec.scales != KVScales::per_tensor))
    fail(ErrorCode::invalid_argument, std::string("tensor_scales: per-tensor scales given for a ") +
                                          (spec.quantized() ? "per-token " : "") +
                                          std::string(dtype_name(spec.dtype)) +
                                          " cache (only caches with scales = per_tensor take them)");
}
Tensor ones(std::vector<i64> shape) {
  Tensor t(DType::f32, std::move(shape));
  float* f = t.data_as<float>();
  for (i64 i = 0; i < t.numel(); ++i) f[i] = 1.f;
  return t;
}
}  // namespace

std::string_view kv_scales_name(KVScales s) {
  return s == KVScales::per_tensor ? "per_tensor" : "per_token";
}

PagedKVCache PagedKVCache::host(const PagedKVSpec& spec, std::optional<KVTensorScales> tensor_scales) {
  paged_index::check_spec(spec);
  check_tensor_scales(spec, tensor_scales);
  auto h = std::make_shared<PoolHolder>();
  h->k = Tensor(spec.dtype, {spec.num_pages, spec.page_size, spec.num_kv_heads, spec.head_dim});
  h->v = Tensor(spec.dtype, {spec.num_pages, spec.page_size, spec.num_kv_heads, spec.dv()});
  if (spec.quantized() && spec.scales == KVScales::per_token) {
    h->ks = ones({spec.num_pages, spec.page_size, spec.num_kv_heads});
    h->vs = ones({spec.num_pages, spec.page_size, spec.num_kv_heads});
  } else if (spec.quantized()) {
    const KVTensorScales ts = tensor_scales.value_or(KVTensorScales{});
    h->ks = Tensor(DType::f32, {1}), h->vs = Tensor(DType::f32, {1});
    h->ks.data_as<float>()[0] = ts.k, h->vs.data_as<float>()[0] = ts.v;
  }
  PagedKVCache c = wrap(h->k, h->v, h->ks, h->vs);
  c.keep_ = std::move(h);
  return c;
}

PagedKVCache PagedKVCache::device(const PagedKVSpec& spec, const GpuSettings& gpu,
                                  std::optional<KVTensorScales> tensor_scales) {
  paged_index::check_spec(spec);
  check_tensor_scales(spec, tensor_scales);
  auto h = std::make_shared<PoolHolder>();
  h->dk = DeviceTensor::zeros(spec.dtype, {spec.num_pages, spec.page_size, spec.num_kv_heads, spec.head_dim},
                              gpu);
  h->dv =
      DeviceTensor::zeros(spec.dtype, {spec.num_pages, spec.page_size, spec.num_kv_heads, spec.dv()}, gpu);
  TensorView ks, vs;
  if (spec.quantized() && spec.scales == KVScales::per_token) {
    const Tensor one = ones({spec.num_pages, spec.page_size, spec.num_kv_heads});
    h->dks = DeviceTensor::from_host(one, gpu), h->dvs = DeviceTensor::from_host(one, gpu);
    ks = h->dks.view(), vs = h->dvs.view();
  } else if (spec.quantized()) {
    const KVTensorScales ts = tensor_scales.value_or(KVTensorScales{});
    h->ks = Tensor(DType::f32, {1}), h->vs = Tensor(DType::f32, {1});
    h->ks.data_as<float>()[0] = ts.k, h->vs.data_as<float>()[0] = ts.v;
    ks = h->ks, vs = h->vs;
  }
  PagedKVCache c = wrap(h->dk.view(), h->dv.view(), ks, vs);
  c.keep_ = std::move(h);
  return c;
}

PagedKVCache PagedKVCache::from_tensors(Tensor k_pages, Tensor v_pages, Tensor k_scales, Tensor v_scales) {
  auto h = std::make_shared<PoolHolder>();
  h->k = std::move(k_pages);
  h->v = std::move(v_pages);
  h->ks = std::move(k_scales);
  h->vs = std::move(v_scales);
  PagedKVCache c = wrap(h->k, h->v, h->ks, h->vs);
  c.keep_ = std::move(h);
  return c;
}

PagedKVCache PagedKVCache::from_device(DeviceTensor k_pages, DeviceTensor v_pages, DeviceTensor k_scales,
                                       DeviceTensor v_scales) {
  if (k_pages.empty() || v_pages.empty())
    fail(ErrorCode::invalid_argument,
         std::string(k_pages.empty() ? "k_pages" : "v_pages") + ": an empty device tensor");
  auto h = std::make_shared<PoolHolder>();
  h->dk = std::move(k_pages);
  h->dv = std::move(v_pages);
  h->dks = std::move(k_scales);
  h->dvs = std::move(v_scales);
  const TensorView ks = h->dks.empty() ? TensorView() : h->dks.view();
  const TensorView vs = h->dvs.empty() ? TensorView() : h->dvs.view();
  PagedKVCache c = wrap(h->dk.view(), h->dv.view(), ks, vs);
  c.keep_ = std::move(h);
  return c;
}

PagedKVCache PagedKVCache::wrap(const TensorView& k_pages, const TensorView& v_pages,
                                const TensorView& k_scales, const TensorView& v_scales) {
  PagedKVCache c;
  PagedKVSpec spec = spec_of(k_pages, v_pages);
  const Scales sc = scales_of(spec, k_pages.on_device(), k_scales, v_scales);
  spec.scales = sc.kind;
  c.spec_ = normalised(spec);
  c.k_ = k_pages;
  c.v_ = v_pages;
  c.tensor_ = sc.tensor;
  if (spec.quantized()) {  // per tensor: the host views given (or made by host() / device())
    c.ks_ = sc.kind == KVScales::per_token ? sc.k : k_scales;
    c.vs_ = sc.kind == KVScales::per_token ? sc.v : v_scales;
  }
  return c;
}

TensorView PagedKVCache::k_page(std::int64_t page) const {
  paged_index::check_page(spec_, page, "k_page");
  return page_view(k_, page);
}

TensorView PagedKVCache::v_page(std::int64_t page) const {
  paged_index::check_page(spec_, page, "v_page");
  return page_view(v_, page);
}

void PagedKVCache::write(const TensorView& k_new, const TensorView& v_new, const TensorView& slot_mapping) {
  if (empty())
    fail(ErrorCode::invalid_argument, "PagedKVCache::write: the cache is empty (default-constructed)");
  // Everything is checked (and an 8-bit cache's rows quantized) before the first byte moves.
  std::vector<Tensor> keep;
  const TensorView k = rows_in(k_new, "k_new", spec_.num_kv_heads, spec_.head_dim, "D", spec_.dtype, keep);
  const TensorView v = rows_in(v_new, "v_new", spec_.num_kv_heads, spec_.dv(), "Dv", spec_.dtype, keep);
  if (v.dim(0) != k.dim(0))
    fail(ErrorCode::shape_mismatch, "v_new: expected " + std::to_string(k.dim(0)) + " rows (as k_new " +
                                        shape_string(k_new.shape()) + "), got " +
                                        shape_string(v_new.shape()));
  const std::vector<i64> slots = paged_index::read_slots(slot_mapping, k.dim(0), spec_);
  // (pool, rows) pairs to write: the codes and, per token, the scales as [.., 1] pools.
  std::vector<std::pair<TensorView, TensorView>> jobs;
  if (spec_.quantized()) {
    const bool token = spec_.scales == KVScales::per_token;
    paged_quant::Rows qk =
        paged_quant::quantize(k, "k_new", spec_.dtype, token ? nullptr : &tensor_.k, slots);
    paged_quant::Rows qv =
        paged_quant::quantize(v, "v_new", spec_.dtype, token ? nullptr : &tensor_.v, slots);
    jobs = {{k_, qk.codes}, {v_, qv.codes}};
    if (token) jobs.insert(jobs.end(), {{as_pool4(ks_), qk.scales}, {as_pool4(vs_), qv.scales}});
    keep.insert(keep.end(), {qk.codes, qv.codes, qk.scales, qv.scales});
  } else {
    jobs = {{k_, k}, {v_, v}};
  }
  if (on_device()) {
    std::vector<std::vector<DeviceStorage::Copy>> copies(jobs.size());
    for (std::size_t i = 0; i < jobs.size(); ++i)
      device_copies(jobs[i].first, jobs[i].second, slots, copies[i]);
    // The cache writes into the storage it was made with (device(), from_device(), wrap()).
    for (std::size_t i = 0; i < jobs.size(); ++i)
      if (!copies[i].empty()) const_cast<DeviceStorage*>(jobs[i].first.device_storage())->write(copies[i]);
    return;
  }
  for (const auto& [pool, rows] : jobs) host_write(pool, rows, slots);
}

namespace {
// Rows [0, kv_len) of a sequence of one pool (or a scale pool as [P, page, H, 1]) into a
// contiguous host tensor [1, kv_len, H, Dh] of the pool's dtype.
Tensor gather_pool(const TensorView& pool, const std::vector<std::int32_t>& pages, i64 kv_len) {
  const i64 ps = pool.dim(1), H = pool.dim(2), Dh = pool.dim(3);
  Tensor out(pool.dtype(), {1, kv_len, H, Dh});
  const i64 es = static_cast<i64>(dtype_size(pool.dtype()));
  auto* dst = static_cast<char*>(out.data());
  std::vector<DeviceStorage::Copy> copies;
  for (i64 j = 0; j < kv_len; ++j) {
    const i64 page = pages[static_cast<std::size_t>(j / ps)], r = j % ps;
    for (i64 h = 0; h < H; ++h) {
      const i64 off = page * pool.stride(0) + r * pool.stride(1) + h * pool.stride(2);
      char* to = dst + ((j * H + h) * Dh) * es;
      if (pool.on_device()) {
        DeviceStorage::Copy c;
        c.device_offset = static_cast<std::size_t>((pool.device_offset() + off) * es);
        c.bytes = static_cast<std::size_t>(Dh * es);
        c.dst = to;
        copies.push_back(c);
      } else {
        std::memcpy(to, static_cast<const char*>(pool.data()) + off * es, static_cast<std::size_t>(Dh * es));
      }
    }
  }
  if (!copies.empty()) pool.device_storage()->read(copies);
  return out;
}
}  // namespace

PagedKVCache::Dense PagedKVCache::gather(const TensorView& page_row, std::int64_t kv_len) const {
  if (empty())
    fail(ErrorCode::invalid_argument, "PagedKVCache::gather: the cache is empty (default-constructed)");
  const std::vector<std::int32_t> pages = paged_index::read_page_row(page_row, kv_len, spec_);
  Dense d{gather_pool(k_, pages, kv_len), gather_pool(v_, pages, kv_len)};
  if (!spec_.quantized()) return d;
  if (spec_.scales == KVScales::per_token) {
    const Tensor ks = gather_pool(as_pool4(ks_), pages, kv_len),
                 vs = gather_pool(as_pool4(vs_), pages, kv_len);
    return Dense{paged_quant::dequantize(d.k, spec_.dtype, &ks, 1.f),
                 paged_quant::dequantize(d.v, spec_.dtype, &vs, 1.f)};
  }
  return Dense{paged_quant::dequantize(d.k, spec_.dtype, nullptr, tensor_.k),
               paged_quant::dequantize(d.v, spec_.dtype, nullptr, tensor_.v)};
}

}  // namespace attnops
