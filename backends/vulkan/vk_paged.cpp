// The Vulkan paged forward (vk_paged.h): the work list built from the plan, the operands bound
// (device-resident pools in place, host ones uploaded), paged_attn + paged_merge (+ convert for a
// 16-bit device output) recorded into one rt::Batch, the read-backs and the RunInfo.
#include "backends/vulkan/vk_paged.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnops/error.h"
#include "backends/vulkan/vk_attention.h"
#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_storage.h"

namespace attnops::vulkan {

namespace {

using i64 = std::int64_t;

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
};
static_assert(sizeof(PagedPush) == 21 * 4 && sizeof(PagedPush) <= rt::Device::kPushConstantBytes);

enum PagedFlag : std::uint32_t { kPagedSoftCap = 1, kPagedSinks = 2, kPagedLse = 4 };

// The tasks of one call: 4 ints each (q row, first page index of its sequence, kv_begin, kv_end),
// and per q row (first task, count).
struct WorkList {
  std::vector<std::int32_t> tasks, row_tasks;
  i64 num_tasks() const { return static_cast<i64>(tasks.size() / 4); }
};

WorkList build_work(const PagedPlan::Data& d) {
  WorkList w;
  w.row_tasks.assign(static_cast<std::size_t>(2 * d.N), 0);
  // The plan's kind of each sequence: stream sequences (few query rows) are split along the keys.
  std::vector<char> stream(static_cast<std::size_t>(d.S), 0);
  for (const PagedWorkItem& item : d.work)
    if (item.kind == PagedWorkKind::stream) stream[static_cast<std::size_t>(item.seq)] = 1;
  const i64 split = std::max<i64>(d.split_tokens, 1);
  const auto push = [&](i64 n, i64 pages, i64 kb, i64 ke) {
    for (i64 v : {n, pages, kb, ke}) w.tasks.push_back(static_cast<std::int32_t>(v));
  };
  for (i64 s = 0; s < d.S; ++s) {
    const auto us = static_cast<std::size_t>(s);
    const i64 pages = d.page_begin[us];
    for (i64 i = 0; i < d.q_len[us]; ++i) {
      const i64 n = d.q_begin[us] + i;
      const KeyRange r = visible_keys(d, s, i);
      const i64 first = w.num_tasks();
      if (r.lo < r.hi) {
        if (stream[us]) {
          for (i64 k = r.lo / split; k * split < r.hi; ++k)
            push(n, pages, std::max(r.lo, k * split), std::min(r.hi, (k + 1) * split));
        } else {
          push(n, pages, r.lo, r.hi);
        }
      }
      w.row_tasks[static_cast<std::size_t>(2 * n)] = static_cast<std::int32_t>(first);
      w.row_tasks[static_cast<std::size_t>(2 * n + 1)] = static_cast<std::int32_t>(w.num_tasks() - first);
    }
  }
  return w;
}

std::uint64_t partial_bytes(const PagedProblem& p, i64 tasks) {
  return static_cast<std::uint64_t>(tasks * p.Hq * (p.Dv + 2)) * 4u;
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
  const std::size_t es = dtype_size(p.dtype);
  const std::pair<const char*, std::uint64_t> buffers[] = {
      {"q", packed_bytes(p.N * p.Hq * p.D, es)},
      {"out (f32)", static_cast<std::uint64_t>(p.N * p.Hq * p.Dv) * 4u},
      {"the split partials", partial_bytes(p, w.num_tasks())},
      {"the work list", w.tasks.size() * 4u},
      {"k_pages",
       p.k_pages.on_device() ? p.k_pages.device_storage()->nbytes() : packed_bytes(p.k_pages.numel(), es)},
      {"v_pages",
       p.v_pages.on_device() ? p.v_pages.device_storage()->nbytes() : packed_bytes(p.v_pages.numel(), es)},
  };
  for (const auto& [name, bytes] : buffers)
    if (bytes > range)
      return feature(std::string(name) + " needs " + mib(bytes) +
                     ", over the device's maxStorageBufferRange (" + mib(range) + ")");
  for (const auto& [name, pool] : {std::pair{"k_pages", &p.k_pages}, std::pair{"v_pages", &p.v_pages}})
    if (last_element(*pool) > u32)
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
  if (w.num_tasks() > std::numeric_limits<std::int32_t>::max() ||
      static_cast<i64>(p.batch->page_ids.size()) > std::numeric_limits<std::int32_t>::max())
    return feature("more than 2^31 tasks or pages in one batch");
  const std::uint32_t fold = fold_of(pd);
  const i64 most = std::max<i64>(w.num_tasks(), p.N);
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

}  // namespace

std::optional<Reason> check_paged_inputs(const PagedProblem& p, const GpuSettings& settings) {
  std::string why;
  const rt::PhysicalDevice* pd = selected_device(settings, &why);
  if (pd == nullptr) return Reason{ReasonCode::backend_unavailable, why};
  return limits_reason(p, *pd, build_work(*p.batch));
}

void run_paged(const PagedProblem& p, const GpuSettings& settings, PagedBuffers& buffers) {
  const bool out_on_device = p.q.on_device();
  const std::shared_ptr<rt::Device> dev = rt::device(settings);  // backend_unavailable without a device
  const rt::PhysicalDevice& pd = dev->physical();
  const PagedPlan::Data& d = *p.batch;
  const WorkList work = build_work(d);
  if (auto reason = limits_reason(p, pd, work))
    throw Error(reason->code == ReasonCode::unsupported_dtype ? ErrorCode::unsupported_dtype
                                                              : ErrorCode::unsupported_feature,
                "Vulkan: " + reason->detail);
  const std::size_t es = dtype_size(p.dtype);
  const std::size_t n_out = static_cast<std::size_t>(p.N * p.Hq * p.Dv);
  const i64 tasks = work.num_tasks();

  std::lock_guard<std::mutex> lock(dev->mutex());
  if (out_on_device)
    buffers.device_out = DeviceTensor(rt::new_storage(dev, n_out * es), p.dtype, {p.N, p.Hq, p.Dv});
  const rt::VulkanStorage* dev_out =
      out_on_device ? static_cast<const rt::VulkanStorage*>(buffers.device_out.storage().get()) : nullptr;
  RunInfo& run = buffers.run;
  run.batch_invariant = true;
  run.kernel = "paged_rowwise";
  run.output = out_on_device ? "device" : "host";
  const int on_dev = int(p.q.on_device()) + 2 * int(p.k_pages.on_device());
  run.inputs = on_dev == 0 ? "host" : on_dev == 3 ? "device" : "mixed";
  run.kernel_detail = "paged_attn (one workgroup of 64 per task and q head; " + std::to_string(tasks) +
                      " tasks: each q row's visible keys, cut every " + std::to_string(d.split_tokens) +
                      " tokens from key 0 for stream sequences) + paged_merge (each row's tasks in key "
                      "order): batch invariant on this device and driver; " +
                      (p.k_pages.on_device() ? "pools read in place" : "host pools uploaded whole") + " on " +
                      pd.info.name;
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
  const rt::Slice pages = upload_array(batch, d.page_ids.data(), d.page_ids.size() * 4u);
  const rt::Slice task_buf = upload_array(batch, work.tasks.data(), work.tasks.size() * 4u);
  const rt::Slice row_tasks = upload_array(batch, work.row_tasks.data(), work.row_tasks.size() * 4u);
  const rt::Slice sinks = upload_array(batch, p.sinks, p.sinks ? static_cast<std::uint64_t>(p.Hq) * 4u : 0u);
  const std::uint64_t part_bytes = partial_bytes(p, tasks);
  const rt::Slice partials = part_bytes > 0 ? batch.scratch(part_bytes) : rt::Slice{};
  const std::uint64_t lse_bytes = p.want_lse ? static_cast<std::uint64_t>(p.N * p.Hq) * 4u : 0u;
  const rt::Slice lse = lse_bytes > 0 ? batch.scratch(lse_bytes) : rt::Slice{};
  const bool convert = out_on_device && p.dtype != DType::f32;
  const rt::Slice out = dev_out != nullptr && !convert ? dev_out->slice() : batch.scratch(n_out * 4u);

  const std::vector<rt::Binding> bindings = {q, k, v, pages, task_buf, partials, row_tasks, sinks, out, lse};
  const std::uint32_t fold = fold_of(pd);
  const auto groups_for = [&](i64 items, std::uint32_t(&g)[3]) {
    const auto n = static_cast<std::uint32_t>(items);
    g[0] = static_cast<std::uint32_t>(p.Hq);  // the heads of one task side by side (shared K/V reads)
    g[1] = std::min(n, fold);
    g[2] = (n + fold - 1) / fold;
  };
  rt::PipelineKey key;
  key.spec = {dtype_code(p.dtype)};
  key.spec_count = 1;
  if (tasks > 0) {
    key.shader = rt::ShaderId::paged_attn;
    pc.num_items = static_cast<std::uint32_t>(tasks);
    pc.fold = fold;
    std::uint32_t g[3];
    groups_for(tasks, g);
    batch.dispatch(key, bindings, &pc, sizeof pc, g, "paged_attn");
  }
  key.shader = rt::ShaderId::paged_merge;
  pc.num_items = static_cast<std::uint32_t>(p.N);
  pc.fold = fold;
  std::uint32_t g[3];
  groups_for(p.N, g);
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
