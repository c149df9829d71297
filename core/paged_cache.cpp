// PagedKVCache: the two page pools, their views, write() (vLLM's reshape_and_cache semantics,
// all or nothing) and gather() (one sequence as dense tensors).
//
// Pool layout: k [P, page_size, Hkv, D], v [P, page_size, Hkv, Dv]; slot = page * page_size +
// row. Host pools are written with memcpy per (row, head); device pools through the storage's
// write(): byte runs of consecutive slots, one submission per pool (existing DeviceStorage
// copies, no shader).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attnops/error.h"
#include "attnops/paged.h"
#include "core/checked_size.h"
#include "core/paged_index.h"

namespace attnops {

namespace {

using i64 = std::int64_t;

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, msg);
}

// What a cache built from storage keeps alive.
struct PoolHolder {
  Tensor k, v;
  DeviceTensor dk, dv;
};

// The spec two pool views describe; Error naming the pool otherwise.
PagedKVSpec spec_of(const TensorView& k, const TensorView& v) {
  for (auto [t, name, layout] : {std::tuple{&k, "k_pages", "[num_pages, page_size, Hkv, D]"},
                                 std::tuple{&v, "v_pages", "[num_pages, page_size, Hkv, Dv]"}}) {
    if (t->rank() != 4)
      fail(ErrorCode::shape_mismatch,
           std::string(name) + ": expected rank 4 " + layout + ", got " + shape_string(t->shape()));
    if (!is_float(t->dtype()))
      fail(ErrorCode::unsupported_dtype,
           std::string(name) + ": expected f32, f16 or bf16, got " + std::string(dtype_name(t->dtype())));
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
  if (x.dtype() == dtype && x.is_contiguous()) return x;
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

}  // namespace

PagedKVCache PagedKVCache::host(const PagedKVSpec& spec) {
  paged_index::check_spec(spec);
  auto h = std::make_shared<PoolHolder>();
  h->k = Tensor(spec.dtype, {spec.num_pages, spec.page_size, spec.num_kv_heads, spec.head_dim});
  h->v = Tensor(spec.dtype, {spec.num_pages, spec.page_size, spec.num_kv_heads, spec.dv()});
  PagedKVCache c = wrap(h->k, h->v);
  c.keep_ = std::move(h);
  return c;
}

PagedKVCache PagedKVCache::device(const PagedKVSpec& spec, const GpuSettings& gpu) {
  paged_index::check_spec(spec);
  auto h = std::make_shared<PoolHolder>();
  h->dk = DeviceTensor::zeros(spec.dtype, {spec.num_pages, spec.page_size, spec.num_kv_heads, spec.head_dim},
                              gpu);
  h->dv =
      DeviceTensor::zeros(spec.dtype, {spec.num_pages, spec.page_size, spec.num_kv_heads, spec.dv()}, gpu);
  PagedKVCache c = wrap(h->dk.view(), h->dv.view());
  c.keep_ = std::move(h);
  return c;
}

PagedKVCache PagedKVCache::from_tensors(Tensor k_pages, Tensor v_pages) {
  auto h = std::make_shared<PoolHolder>();
  h->k = std::move(k_pages);
  h->v = std::move(v_pages);
  PagedKVCache c = wrap(h->k, h->v);
  c.keep_ = std::move(h);
  return c;
}

PagedKVCache PagedKVCache::from_device(DeviceTensor k_pages, DeviceTensor v_pages) {
  if (k_pages.empty() || v_pages.empty())
    fail(ErrorCode::invalid_argument,
         std::string(k_pages.empty() ? "k_pages" : "v_pages") + ": an empty device tensor");
  auto h = std::make_shared<PoolHolder>();
  h->dk = std::move(k_pages);
  h->dv = std::move(v_pages);
  PagedKVCache c = wrap(h->dk.view(), h->dv.view());
  c.keep_ = std::move(h);
  return c;
}

PagedKVCache PagedKVCache::wrap(const TensorView& k_pages, const TensorView& v_pages) {
  PagedKVCache c;
  c.spec_ = spec_of(k_pages, v_pages);
  c.k_ = k_pages;
  c.v_ = v_pages;
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
  // Everything is checked before the first byte moves.
  std::vector<Tensor> keep;
  const TensorView k = rows_in(k_new, "k_new", spec_.num_kv_heads, spec_.head_dim, "D", spec_.dtype, keep);
  const TensorView v = rows_in(v_new, "v_new", spec_.num_kv_heads, spec_.dv(), "Dv", spec_.dtype, keep);
  if (v.dim(0) != k.dim(0))
    fail(ErrorCode::shape_mismatch, "v_new: expected " + std::to_string(k.dim(0)) + " rows (as k_new " +
                                        shape_string(k_new.shape()) + "), got " +
                                        shape_string(v_new.shape()));
  const std::vector<i64> slots = paged_index::read_slots(slot_mapping, k.dim(0), spec_);
  if (on_device()) {
    std::vector<DeviceStorage::Copy> kc, vc;
    device_copies(k_, k, slots, kc);
    device_copies(v_, v, slots, vc);
    // The cache writes into the storage it was made with (device(), from_device(), wrap()).
    if (!kc.empty()) const_cast<DeviceStorage*>(k_.device_storage())->write(kc);
    if (!vc.empty()) const_cast<DeviceStorage*>(v_.device_storage())->write(vc);
    return;
  }
  host_write(k_, k, slots);
  host_write(v_, v, slots);
}

PagedKVCache::Dense PagedKVCache::gather(const TensorView& page_row, std::int64_t kv_len) const {
  if (empty())
    fail(ErrorCode::invalid_argument, "PagedKVCache::gather: the cache is empty (default-constructed)");
  const std::vector<std::int32_t> pages = paged_index::read_page_row(page_row, kv_len, spec_);
  const i64 ps = spec_.page_size, H = spec_.num_kv_heads;
  Dense d{Tensor(spec_.dtype, {1, kv_len, H, spec_.head_dim}),
          Tensor(spec_.dtype, {1, kv_len, H, spec_.dv()})};
  const i64 es = static_cast<i64>(dtype_size(spec_.dtype));
  for (auto [pool, out] : {std::pair{&k_, &d.k}, std::pair{&v_, &d.v}}) {
    const i64 Dh = pool->dim(3);
    auto* dst = static_cast<char*>(out->data());
    std::vector<DeviceStorage::Copy> copies;
    for (i64 j = 0; j < kv_len; ++j) {
      const i64 page = pages[static_cast<std::size_t>(j / ps)], r = j % ps;
      for (i64 h = 0; h < H; ++h) {
        const i64 off = page * pool->stride(0) + r * pool->stride(1) + h * pool->stride(2);
        char* to = dst + ((j * H + h) * Dh) * es;
        if (pool->on_device()) {
          DeviceStorage::Copy c;
          c.device_offset = static_cast<std::size_t>((pool->device_offset() + off) * es);
          c.bytes = static_cast<std::size_t>(Dh * es);
          c.dst = to;
          copies.push_back(c);
        } else {
          std::memcpy(to, static_cast<const char*>(pool->data()) + off * es,
                      static_cast<std::size_t>(Dh * es));
        }
      }
    }
    if (!copies.empty()) pool->device_storage()->read(copies);
  }
  return d;
}

}  // namespace attnops
