// The Vulkan paged forward (vk_paged.h): the work list built from the plan (vk_paged_work.h), the
// operands bound (device-resident pools in place, host ones uploaded), paged_attn (tile rows) +
// paged_decode (stream sequences) + paged_merge (+ convert for a 16-bit device output) recorded
// into one rt::Batch, the read-backs and the RunInfo.
#include "backends/vulkan/vk_paged.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnops/error.h"
#include "attnops/ext/device_storage.h"
#include "attnops/ext/paged_problem.h"
#include "backends/vulkan/vk_attention.h"
#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_instance.h"
#include "backends/vulkan/vk_paged_work.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_storage.h"

namespace attnops::vulkan {

namespace {

using i64 = std::int64_t;
using paged::WorkList;

constexpr i64 kMaxPagedHeadDim = 512;  // paged_attn.comp's MAXD
constexpr std::uint32_t kGroupSize = 64;

// Must match `PagedPush` in shaders/paged_io.glsl (std430 scalars).
struct PagedPush {
  std::int32_t Hq, group, D, Dv, page_size;
  float scale, soft_cap;
  std::uint32_t flags;
  std::uint32_t q_off, q_sn, q_sh;
  std::uint32_t k_off, k_sp, k_sr, k_sh;
  std::uint32_t v_off, v_sp, v_sr, v_sh;
  std::uint32_t num_items, fold;
  float k_scale, v_scale;
  std::uint32_t ks_off, ks_sp, ks_sr, ks_sh;
  std::uint32_t vs_off, vs_sp, vs_sr, vs_sh;
};
static_assert(sizeof(PagedPush) == 31 * 4 && sizeof(PagedPush) <= rt::Device::kPushConstantBytes);

enum PagedFlag : std::uint32_t { kPagedSoftCap = 1, kPagedSinks = 2, kPagedLse = 4 };

// The pools' dtype as paged_io.glsl's KVTYPE.
std::uint32_t kv_code(DType t) {
  switch (t) {
    case DType::f16:
      return 1;
    case DType::bf16:
      return 2;
    case DType::i8:
      return 3;
    case DType::fp8_e4m3:
      return 4;
    default:
      return 0;
  }
}

std::uint64_t partial_bytes(const PagedProblem& p, i64 slots) {
  return static_cast<std::uint64_t>(slots * p.Hq * (p.Dv + 2)) * 4u;
}

// Workgroups along y (tasks or rows; x is the q head) before the rest folds onto z.
std::uint32_t fold_of(const rt::PhysicalDevice& pd) {
  return std::max<std::uint32_t>(1u, std::min<std::uint32_t>(pd.caps.max_group_count[1], 65535u));
}

// The largest element index a shader computes into a pool view (k or v): off + last row + Dh.
std::uint64_t last_element(const TensorView& pool) {
  std::uint64_t e = static_cast<std::uint64_t>(pool.on_device() ? pool.device_offset() : 0) +
                    static_cast<std::uint64_t>(pool.dim(3));
  for (int a = 0; a < 3; ++a) e += static_cast<std::uint64_t>((pool.dim(a) - 1) * pool.stride(a));
  return e;
}

// A per-token scale pool [P, page, H] as a pool [P, page, H, 1] (pool_operand's shape).
TensorView as_pool4(const TensorView& s) {
  const std::vector<i64> shape{s.dim(0), s.dim(1), s.dim(2), 1};
  const std::vector<i64> strides{s.stride(0), s.stride(1), s.stride(2), 1};
  if (s.on_device()) return TensorView(s.device_storage(), s.device_offset(), s.dtype(), shape, strides);
  return TensorView(s.data(), s.dtype(), shape, strides);
}

std::optional<Reason> limits_reason(const PagedProblem& p, const rt::PhysicalDevice& pd, const WorkList& w) {
  const auto feature = [](std::string detail) { return Reason{ReasonCode::unsupported_feature, detail}; };
  if (!is_float(p.dtype))
    return Reason{ReasonCode::unsupported_dtype,
                  "dtype " + std::string(dtype_name(p.dtype)) + " (expected f32, f16 or bf16)"};
  if (p.D > kMaxPagedHeadDim || p.Dv > kMaxPagedHeadDim)
    return feature("head_dim D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) +
                   " (the Vulkan paged kernel takes head dims up to " + std::to_string(kMaxPagedHeadDim) +
                   ")");
  const std::uint64_t range = buffer_range(pd);
  const std::uint64_t u32 = std::numeric_limits<std::uint32_t>::max();
  const std::size_t es = dtype_size(p.dtype), kes = dtype_size(p.kv_dtype);
  const auto pool_bytes = [&](const TensorView& t, std::size_t e) -> std::uint64_t {
    if (t.empty()) return 0;
    return t.on_device() ? t.device_storage()->nbytes() : packed_bytes(t.numel(), e);
  };
  const std::pair<const char*, std::uint64_t> buffers[] = {
      {"q", packed_bytes(p.N * p.Hq * p.D, es)},
      {"out (f32)", static_cast<std::uint64_t>(p.N * p.Hq * p.Dv) * 4u},
      {"the split partials", partial_bytes(p, w.slots)},
      {"the work list", std::max(w.tasks.size(), w.units.size()) * 4u},
      {"k_pages", pool_bytes(p.k_pages, kes)},
      {"v_pages", pool_bytes(p.v_pages, kes)},
      {"k_scales", pool_bytes(p.k_scales, 4)},
      {"v_scales", pool_bytes(p.v_scales, 4)},
  };
  for (const auto& [name, bytes] : buffers)
    if (bytes > range)
      return feature(std::string(name) + " needs " + mib(bytes) +
                     ", over the device's maxStorageBufferRange (" + mib(range) + ")");
  for (const auto& [name, pool] : {std::pair{"k_pages", &p.k_pages}, std::pair{"v_pages", &p.v_pages}})
    if (last_element(*pool) > u32)
      return feature(std::string(name) + ": element offsets past 2^32 (the shaders index in 32 bits)");
  for (const auto& [name, sc] : {std::pair{"k_scales", &p.k_scales}, std::pair{"v_scales", &p.v_scales}})
    if (!sc->empty() && last_element(as_pool4(*sc)) > u32)
      return feature(std::string(name) + ": element offsets past 2^32 (the shaders index in 32 bits)");
  if (p.q.on_device()) {
    const std::uint64_t last =
        static_cast<std::uint64_t>(p.q.device_offset()) +
        static_cast<std::uint64_t>((p.N - 1) * p.q.stride(0) + (p.Hq - 1) * p.q.stride(1) + p.D);
    if (p.N > 0 && last > u32) return feature("q: element offsets past 2^32 (the shaders index in 32 bits)");
  }
  const auto& kv = p.batch->kv_len;
  if (!kv.empty() && *std::max_element(kv.begin(), kv.end()) > std::numeric_limits<std::int32_t>::max())
    return feature("a kv_len past 2^31 (the shaders index keys in 32 bits)");
  if (w.slots > std::numeric_limits<std::int32_t>::max() ||
      static_cast<i64>(p.batch->page_ids.size()) > std::numeric_limits<std::int32_t>::max())
    return feature("more than 2^31 tasks or pages in one batch");
  const std::uint32_t fold = fold_of(pd);
  const i64 most = std::max<i64>({w.num_tasks(), w.num_units(), p.N});
  if (p.Hq > static_cast<i64>(pd.caps.max_group_count[0]) ||
      (most + fold - 1) / fold > static_cast<i64>(pd.caps.max_group_count[2]))
    return feature("the work list (" + std::to_string(most) + " items x Hq=" + std::to_string(p.Hq) +
                   ") exceeds maxComputeWorkGroupCount");
  if (kGroupSize > pd.caps.max_invocations || kGroupSize > pd.caps.max_group_size[0])
    return feature("workgroups of 64 invocations exceed the device's limit");
  return std::nullopt;
}

const rt::PhysicalDevice* selected_device(const GpuSettings& settings, std::string* why) {
  const int index = rt::selected_index(settings, why);
  if (index < 0) return nullptr;
  return &rt::instance().devices()[static_cast<std::size_t>(index)];
}

std::uint32_t u32_of(i64 v, const char* name) {
  if (v < 0 || v > static_cast<i64>(std::numeric_limits<std::uint32_t>::max()))
    throw Error(ErrorCode::unsupported_feature,
                std::string("Vulkan: ") + name + ": device view offsets and strides must fit in 32 bits");
  return static_cast<std::uint32_t>(v);
}

// A pool [P, page, H, Dh]: bound in place when device-resident, else uploaded packed. Sets the
// offset and the page / row / head strides (elements).
rt::Slice pool_operand(rt::Batch& batch, const TensorView& pool, const char* name, std::uint32_t& off,
                       std::uint32_t& sp, std::uint32_t& sr, std::uint32_t& sh) {
  if (pool.on_device()) {
    const rt::VulkanStorage& s = rt::storage_of(pool, batch.device(), name);
    off = u32_of(pool.device_offset(), name);
    sp = u32_of(pool.stride(0), name), sr = u32_of(pool.stride(1), name), sh = u32_of(pool.stride(2), name);
    return s.slice();
  }
  const std::size_t es = dtype_size(pool.dtype());
  const i64 P = pool.dim(0), ps = pool.dim(1), H = pool.dim(2), Dh = pool.dim(3);
  const std::uint64_t bytes = packed_bytes(pool.numel(), es);
  off = 0, sp = static_cast<std::uint32_t>(ps * H * Dh), sr = static_cast<std::uint32_t>(H * Dh);
  sh = static_cast<std::uint32_t>(Dh);
  if (bytes == 0) return {};
  rt::Slice slice = batch.scratch(bytes);
  batch.upload(slice, 0, bytes, [&](std::byte* dst) {
    const auto* src = static_cast<const std::byte*>(pool.data());
    const std::size_t row = static_cast<std::size_t>(Dh) * es;
    for (i64 a = 0; a < P; ++a)
      for (i64 r = 0; r < ps; ++r)
        for (i64 h = 0; h < H; ++h) {
          const i64 e = a * pool.stride(0) + r * pool.stride(1) + h * pool.stride(2);
          std::memcpy(dst, src + e * static_cast<i64>(es), row);
          dst += row;
        }
  });
  return slice;
}

// f32 rows -> the caller's output in its dtype (bit-exact round-to-nearest-even).
void unpack_out(const float* f, std::size_t n, DType dtype, Tensor& out) {
  if (dtype == DType::f32) {
    std::memcpy(out.data(), f, n * 4u);
    return;
  }
  auto* o = out.data_as<std::uint16_t>();
  for (std::size_t i = 0; i < n; ++i)
    o[i] = dtype == DType::f16 ? float_to_half_bits(f[i]) : float_to_bf16_bits(f[i]);
}

// The decode kernel's tiles on this device (nullopt: the row-wise path; `why` says why).
std::optional<paged::DecodeTiles> tiles_for(const PagedProblem& p, const rt::PhysicalDevice& pd,
                                            std::string* why) {
  if (const char* e = std::getenv("ATTNOPS_VK_PAGED_ROWWISE"); e != nullptr && std::string(e) == "1") {
    *why = "ATTNOPS_VK_PAGED_ROWWISE=1";
    return std::nullopt;
  }
  return paged::decode_tiles(rt::selection_desc(pd), p, why);
}

}  // namespace

std::optional<Reason> check_paged_inputs(const PagedProblem& p, const GpuSettings& settings) {
  std::string why;
  const rt::PhysicalDevice* pd = selected_device(settings, &why);
  if (pd == nullptr) return Reason{ReasonCode::backend_unavailable, why};
  const std::optional<paged::DecodeTiles> t = tiles_for(p, *pd, &why);
  return limits_reason(p, *pd, paged::build_work(*p.batch, p.group(), t ? &*t : nullptr));
}

void run_paged(const PagedProblem& p, const GpuSettings& settings, PagedBuffers& buffers) {
  const bool out_on_device = p.q.on_device();
  const std::shared_ptr<rt::Device> dev = rt::device(settings);  // backend_unavailable without a device
  const rt::PhysicalDevice& pd = dev->physical();
  const PagedPlanData& d = *p.batch;
  std::string no_decode;
  const std::optional<paged::DecodeTiles> tiles = tiles_for(p, pd, &no_decode);
  const WorkList work = paged::build_work(d, p.group(), tiles ? &*tiles : nullptr);
  if (auto reason = limits_reason(p, pd, work))
    throw Error(reason->code == ReasonCode::unsupported_dtype ? ErrorCode::unsupported_dtype
                                                              : ErrorCode::unsupported_feature,
                "Vulkan: " + reason->detail);
  const std::size_t es = dtype_size(p.dtype);
  const std::size_t n_out = static_cast<std::size_t>(p.N * p.Hq * p.Dv);
  const i64 tasks = work.num_tasks(), units = work.num_units();

  std::lock_guard<std::mutex> lock(dev->mutex());
  if (out_on_device)
    buffers.device_out = DeviceTensor(rt::new_storage(dev, n_out * es), p.dtype, {p.N, p.Hq, p.Dv});
  const rt::VulkanStorage* dev_out =
      out_on_device ? static_cast<const rt::VulkanStorage*>(buffers.device_out.storage().get()) : nullptr;
  RunInfo& run = buffers.run;
  run.batch_invariant = true;
  run.kernel = units > 0 ? "paged_decode" : "paged_rowwise";
  run.output = out_on_device ? "device" : "host";
  const int on_dev = int(p.q.on_device()) + 2 * int(p.k_pages.on_device());
  run.inputs = on_dev == 0 ? "host" : on_dev == 3 ? "device" : "mixed";
  std::string kinds =
      tiles ? "paged_decode (stream sequences: one workgroup of " + std::to_string(tiles->wg) +
                  " per kv head and unit of up to " + std::to_string(tiles->rows) + " rows of one split, " +
                  std::to_string(tiles->ds) + " lanes per key, the split's keys over the teams; " +
                  std::to_string(units) + " units), "
            : "stream rows as row tasks (" + no_decode + "), ";
  run.kernel_detail =
      kinds + "paged_attn (one workgroup of 64 per tile task and q head; " + std::to_string(tasks) +
      " tasks) + paged_merge (each row's splits in key order, cut every " + std::to_string(d.split_tokens) +
      " tokens from key 0): batch invariant on this device and driver; " +
      (p.quantized() ? std::string(dtype_name(p.kv_dtype)) + " pools x " +
                           std::string(kv_scales_name(p.scales)) + " scales; "
                     : std::string()) +
      (p.k_pages.on_device() ? "pools read in place" : "host pools uploaded whole") + " on " + pd.info.name;
  if (p.N == 0 || p.Hq == 0) {
    if (out_on_device && n_out > 0) {  // not reached (Dv >= 1), kept for symmetry with the dense path
      rt::Batch batch(*dev, false);
      batch.zero(dev_out->slice(), 0, dev_out->slice().size);
      batch.submit();
    }
    return;
  }

  rt::Batch batch(*dev, p.profile);
  PagedPush pc{};
  pc.Hq = static_cast<std::int32_t>(p.Hq);
  pc.group = static_cast<std::int32_t>(p.group());
  pc.D = static_cast<std::int32_t>(p.D);
  pc.Dv = static_cast<std::int32_t>(p.Dv);
  pc.page_size = static_cast<std::int32_t>(p.page_size);
  pc.scale = static_cast<float>(p.scale);
  pc.soft_cap = p.soft_cap ? static_cast<float>(*p.soft_cap) : 0.f;
  pc.flags = (p.soft_cap ? kPagedSoftCap : 0u) | (p.sinks ? kPagedSinks : 0u) | (p.want_lse ? kPagedLse : 0u);
  pc.k_scale = p.k_scale, pc.v_scale = p.v_scale;

  rt::Slice q;
  if (p.q.on_device()) {
    q = rt::storage_of(p.q, *dev, "q").slice();
    pc.q_off = u32_of(p.q.device_offset(), "q");
    pc.q_sn = u32_of(p.q.stride(0), "q"), pc.q_sh = u32_of(p.q.stride(1), "q");
  } else {
    const std::uint64_t bytes = packed_bytes(p.N * p.Hq * p.D, es);
    q = batch.scratch(bytes);
    batch.upload(q, 0, bytes, [&](std::byte* dst) {
      const auto* src = static_cast<const std::byte*>(p.q.data());
      const std::size_t row = static_cast<std::size_t>(p.D) * es;
      for (i64 n = 0; n < p.N; ++n)
        for (i64 h = 0; h < p.Hq; ++h) {
          std::memcpy(dst, src + (n * p.q.stride(0) + h * p.q.stride(1)) * static_cast<i64>(es), row);
          dst += row;
        }
    });
    pc.q_off = 0, pc.q_sn = static_cast<std::uint32_t>(p.Hq * p.D), pc.q_sh = static_cast<std::uint32_t>(p.D);
  }
  const rt::Slice k = pool_operand(batch, p.k_pages, "k_pages", pc.k_off, pc.k_sp, pc.k_sr, pc.k_sh);
  const rt::Slice v = pool_operand(batch, p.v_pages, "v_pages", pc.v_off, pc.v_sp, pc.v_sr, pc.v_sh);
  rt::Slice ks, vs;
  if (p.per_token_scales()) {
    ks = pool_operand(batch, as_pool4(p.k_scales), "k_scales", pc.ks_off, pc.ks_sp, pc.ks_sr, pc.ks_sh);
    vs = pool_operand(batch, as_pool4(p.v_scales), "v_scales", pc.vs_off, pc.vs_sp, pc.vs_sr, pc.vs_sh);
  }
  const rt::Slice pages = upload_array(batch, d.page_ids.data(), d.page_ids.size() * 4u);
  const rt::Slice task_buf = upload_array(batch, work.tasks.data(), work.tasks.size() * 4u);
  const rt::Slice unit_buf = upload_array(batch, work.units.data(), work.units.size() * 4u);
  const rt::Slice row_slots = upload_array(batch, work.row_slots.data(), work.row_slots.size() * 4u);
  const rt::Slice row_ranges = upload_array(batch, work.row_ranges.data(), work.row_ranges.size() * 4u);
  const rt::Slice sinks = upload_array(batch, p.sinks, p.sinks ? static_cast<std::uint64_t>(p.Hq) * 4u : 0u);
  const std::uint64_t part_bytes = partial_bytes(p, work.slots);
  const rt::Slice partials = part_bytes > 0 ? batch.scratch(part_bytes) : rt::Slice{};
  const std::uint64_t lse_bytes = p.want_lse ? static_cast<std::uint64_t>(p.N * p.Hq) * 4u : 0u;
  const rt::Slice lse = lse_bytes > 0 ? batch.scratch(lse_bytes) : rt::Slice{};
  const bool convert = out_on_device && p.dtype != DType::f32;
  const rt::Slice out = dev_out != nullptr && !convert ? dev_out->slice() : batch.scratch(n_out * 4u);

  const std::vector<rt::Binding> bindings = {q,     k,   v,   pages, task_buf, partials,   row_slots,
                                             sinks, out, lse, ks,    vs,       row_ranges, unit_buf};
  const std::uint32_t fold = fold_of(pd);
  const auto groups_for = [&](i64 items, std::uint32_t x, std::uint32_t(&g)[3]) {
    const auto n = static_cast<std::uint32_t>(items);
    g[0] = x;  // the heads of one task side by side (shared K/V reads)
    g[1] = std::min(n, fold);
    g[2] = (n + fold - 1) / fold;
  };
  const std::uint32_t scales = !p.quantized() ? 0u : p.per_token_scales() ? 1u : 2u;
  rt::PipelineKey key;
  key.spec = {dtype_code(p.dtype), kv_code(p.kv_dtype), scales};
  key.spec_count = 3;
  pc.fold = fold;
  if (tasks > 0) {
    key.shader = rt::ShaderId::paged_attn;
    pc.num_items = static_cast<std::uint32_t>(tasks);
    std::uint32_t g[3];
    groups_for(tasks, static_cast<std::uint32_t>(p.Hq), g);
    batch.dispatch(key, bindings, &pc, sizeof pc, g, "paged_attn");
  }
  if (units > 0) {
    rt::PipelineKey dk = key;
    dk.shader = rt::ShaderId::paged_decode;
    // Vector loads when every row's chunks are whole and start on their alignment (8 elements).
    const auto aligned = [&](std::uint32_t off, std::uint32_t sp, std::uint32_t sr, std::uint32_t sh,
                             i64 Dh) {
      return Dh % 8 == 0 && off % 8 == 0 && sp % 8 == 0 && sr % 8 == 0 && sh % 8 == 0;
    };
    const bool vec = aligned(pc.k_off, pc.k_sp, pc.k_sr, pc.k_sh, p.D) &&
                     aligned(pc.v_off, pc.v_sp, pc.v_sr, pc.v_sh, p.Dv);
    dk.spec = {dtype_code(p.dtype), kv_code(p.kv_dtype), scales,
               tiles->wg,           tiles->ds,           tiles->rows,
               tiles->dk8,          tiles->dv8,          tiles->max_subgroups,
               vec ? 1u : 0u};
    dk.spec_count = 10;
    dk.full_subgroups = tiles->full_subgroups;
    pc.num_items = static_cast<std::uint32_t>(units);
    std::uint32_t g[3];
    groups_for(units, static_cast<std::uint32_t>(p.Hkv), g);
    batch.dispatch(dk, bindings, &pc, sizeof pc, g, "paged_decode");
  }
  key.shader = rt::ShaderId::paged_merge;
  pc.num_items = static_cast<std::uint32_t>(p.N);
  std::uint32_t g[3];
  groups_for(p.N, static_cast<std::uint32_t>(p.Hq), g);
  batch.dispatch(key, bindings, &pc, sizeof pc, g, "paged_merge");
  if (convert) {
    rt::PipelineKey ck;
    ck.shader = rt::ShaderId::convert;
    ck.spec = {dtype_code(p.dtype)};
    ck.spec_count = 1;
    const auto n = static_cast<std::uint32_t>(n_out);
    const std::uint32_t cgroups[3] = {((n + 1) / 2 + 255) / 256, 1, 1};
    batch.dispatch(ck, {out, dev_out->slice()}, &n, sizeof n, cgroups, "convert");
  }
  // Read-backs run only after the fence signalled success: the caller's buffers are never half
  // written.
  if (!out_on_device)
    batch.download(out, 0, n_out * 4u, [&](const std::byte* src) {
      unpack_out(reinterpret_cast<const float*>(src), n_out, p.dtype, buffers.out);
    });
  if (buffers.lse && lse_bytes > 0)
    batch.download(lse, 0, lse_bytes,
                   [&](const std::byte* src) { std::memcpy(buffers.lse->data(), src, lse_bytes); });
  batch.submit();
  dev->persist_cache(settings.pipeline_cache);
  if (convert) run.kernel_detail += "; convert pass to " + std::string(dtype_name(p.dtype));
  run.bytes_to_device = batch.bytes_to_device();
  run.bytes_to_host = batch.bytes_to_host();
  if (p.profile) run.timings = batch.timings();
}

}  // namespace attnops::vulkan
