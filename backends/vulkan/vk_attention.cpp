// The attention kernels' launch code on the runtime (vk_attention.h): the kernel variant chosen
// from the device's caps (vk_kernel_select.h), the block map at that variant's tile, the launch
// plan (vk_launch.h) recorded into one rt::Batch (one submission, every pass timed under its
// name), the read-backs, and the RunInfo that names the variant.
#include "backends/vulkan/vk_attention.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "attnops/error.h"
#include "attnops/ext/device_storage.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_kernel_select.h"
#include "backends/vulkan/vk_launch.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_selfcheck.h"
#include "backends/vulkan/vk_storage.h"
#include "backends/vulkan/vk_tile_plan.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan {

// Helpers shared with the other launch files (declared in vk_attention.h).

std::uint32_t dtype_code(DType t) {
  return t == DType::f32 ? 0u : t == DType::f16 ? 1u : 2u;
}

std::uint64_t packed_bytes(std::int64_t elements, std::size_t elem_size) {
  return (static_cast<std::uint64_t>(elements) * elem_size + 15u) / 16u * 16u;
}

std::uint64_t bias_elements(const AttentionProblem& p) {
  if (!p.bias) return 0;
  return static_cast<std::uint64_t>((p.B - 1) * p.bias_stride_b + (p.Hq - 1) * p.bias_stride_h + p.Tq * p.Tk);
}

std::uint64_t buffer_range(const rt::PhysicalDevice& pd) {
  const std::uint64_t cap = debug::max_buffer_bytes();
  const std::uint64_t range = pd.caps.max_storage_buffer_range;
  return cap > 0 && cap < range ? cap : range;
}

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

void pack_bthd(const TensorView& t, void* dst) {
  const std::size_t es = dtype_size(t.dtype());
  const std::int64_t B = t.dim(0), T = t.dim(1), H = t.dim(2), D = t.dim(3);
  const auto* src = static_cast<const unsigned char*>(t.data());
  auto* out = static_cast<unsigned char*>(dst);
  const std::size_t row = static_cast<std::size_t>(D) * es;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t off = b * t.stride(0) + i * t.stride(1) + h * t.stride(2);
        std::memcpy(out, src + off * static_cast<std::int64_t>(es), row);
        out += row;
      }
}

std::int32_t clip32(std::int64_t v, std::int64_t hi) {
  return static_cast<std::int32_t>(std::min(v, hi));
}

rt::Slice upload_array(rt::Batch& batch, const void* data, std::uint64_t bytes) {
  if (data == nullptr || bytes == 0) return {};
  rt::Slice s = batch.scratch(bytes);
  batch.upload(s, 0, bytes, [&](std::byte* dst) { std::memcpy(dst, data, bytes); });
  return s;
}

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::vanilla:
      return "vanilla";
    case Kernel::flash:
      return "flash";
    case Kernel::blocksparse:
      return "blocksparse";
  }
  return "?";
}

}  // namespace

// The kernel variant for `p` on `pd` (vk_kernel_select.h), under the test / bench override
// (vulkan_debug.h). Empty dimensions count as 1: nothing runs then, but the rules stay defined.
Selection select_for(Kernel kernel, const AttentionProblem& p, const rt::PhysicalDevice& pd,
                     const std::vector<DisabledVariant>& disabled) {
  ProblemShape shape;
  shape.vanilla = kernel == Kernel::vanilla;
  shape.want_weights = p.want_weights;
  shape.buffer_range = buffer_range(pd);
  shape.scores_fit = static_cast<std::uint64_t>(p.B * p.Hq * p.Tq * p.Tk) * 4u <= shape.buffer_range;
  shape.per_head_map = p.mask.head_dependent();
  shape.dtype = p.dtype;
  const auto at_least_1 = [](std::int64_t v) { return std::max<std::int64_t>(v, 1); };
  shape.B = at_least_1(p.B), shape.Tq = at_least_1(p.Tq), shape.Tk = at_least_1(p.Tk);
  shape.Hq = at_least_1(p.Hq), shape.Hkv = at_least_1(p.Hkv), shape.D = at_least_1(p.D);
  shape.Dv = at_least_1(p.Dv);
  if (shape.Hq % shape.Hkv != 0) shape.Hkv = 1;  // rejected by the problem's checks anyway
  return select_kernel(rt::selection_desc(pd), build_caps(), shape, debug::kernel_override(), disabled);
}

namespace {

LaunchPlan plan_for(const AttentionProblem& p, const Selection& sel, const PushConstants& base) {
  return sel.variant == Variant::vanilla_gemm ? plan_vanilla_gemm(p, sel, base) : plan_flash(p, sel, base);
}

// The device buffers of one run whose sizes depend only on the problem and the plan.
struct Sizes {
  std::uint64_t q, k, v, out, lse, bias, seg_q, seg_kv, scratch;
};
Sizes sizes_of(const AttentionProblem& p, const LaunchPlan& plan) {
  const std::size_t es = dtype_size(p.dtype);
  Sizes s{};
  s.q = packed_bytes(p.B * p.Tq * p.Hq * p.D, es);
  s.k = packed_bytes(p.B * p.Tk * p.Hkv * p.D, es);
  s.v = packed_bytes(p.B * p.Tk * p.Hkv * p.Dv, es);
  s.out = static_cast<std::uint64_t>(p.B * p.Tq * p.Hq * p.Dv) * 4u;
  s.lse = p.want_lse ? static_cast<std::uint64_t>(p.B * p.Hq * p.Tq) * 4u : 0;
  s.bias = bias_elements(p) * 4u;
  s.seg_q = p.has_segments() ? static_cast<std::uint64_t>(p.B * p.Tq) * 4u : 0;
  s.seg_kv = p.has_segments() ? static_cast<std::uint64_t>(p.B * p.Tk) * 4u : 0;
  s.scratch = plan.scratch_bytes;
  return s;
}

}  // namespace

std::optional<Reason> limits_reason(Kernel kernel, const AttentionProblem& p, const rt::PhysicalDevice& pd,
                                    const Selection& sel) {
  const auto feature = [](std::string detail) { return Reason{ReasonCode::unsupported_feature, detail}; };
  const rt::DeviceCaps& caps = pd.caps;
  if (!is_float(p.dtype))
    return Reason{ReasonCode::unsupported_dtype,
                  "q/k/v dtype " + std::string(dtype_name(p.dtype)) + " (expected f32, f16 or bf16)"};
  const std::int64_t max_dim = sel.variant == Variant::flash_rowwise ? kMaxRowwiseHeadDim : kMaxHeadDim;
  if (p.D > max_dim || p.Dv > max_dim)
    return feature("head_dim D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) +
                   " (the Vulkan kernel " + variant_name(sel.variant) + " takes head dims up to " +
                   std::to_string(max_dim) + (sel.not_taken.empty() ? "" : "; " + sel.not_taken.back()) +
                   ")");
  if (p.want_weights && kernel != Kernel::vanilla)
    return feature(std::string("attention weights are computed by vanilla only, not by ") +
                   kernel_name(kernel));
  // Every index the shaders compute is a 32-bit int.
  const std::int64_t kIntMax = std::numeric_limits<std::int32_t>::max();
  if (p.Tq + p.Tk > kIntMax) return feature("Tq + Tk must fit in 32 bits");
  PushConstants shape_only{};
  shape_only.nq = static_cast<std::int32_t>(ceil_div(p.Tq, map_tile(sel).bq));
  const LaunchPlan plan = plan_for(p, sel, shape_only);
  const std::uint64_t range = buffer_range(pd);
  const Sizes s = sizes_of(p, plan);
  const std::pair<const char*, std::uint64_t> buffers[] = {
      {"q", s.q},
      {"k", s.k},
      {"v", s.v},
      {"out (f32)", s.out},
      {"lse", s.lse},
      {"bias", s.bias},
      {"seg_q", s.seg_q},
      {"seg_kv", s.seg_kv},
      {sel.variant == Variant::vanilla_gemm ? "vanilla weights [B, Hq, Tq, Tk] f32" : "split-KV partials",
       s.scratch},
  };
  for (const auto& [name, bytes] : buffers) {
    if (bytes > range)
      return feature(std::string(name) + " needs " + mib(bytes) +
                     ", over the device's maxStorageBufferRange (" + mib(range) + ")");
    if (bytes > caps.max_allocation)
      return feature(std::string(name) + " needs " + mib(bytes) +
                     ", over the device's maxMemoryAllocationSize (" + mib(caps.max_allocation) + ")");
    if (bytes / 2 > static_cast<std::uint64_t>(kIntMax))  // 16-bit element indices must fit in an int
      return feature(std::string(name) + " has more than 2^31 elements");
  }
  for (const auto& [name, t, heads, dim] :
       {std::tuple{"q", &p.q, p.Hq, p.D}, std::tuple{"k", &p.k, p.Hkv, p.D},
        std::tuple{"v", &p.v, p.Hkv, p.Dv}}) {
    if (!t->on_device()) continue;
    // Device views are read in place: heads packed, offsets and strides addressable in 32 bits.
    if (t->stride(2) != dim && heads > 1)
      return feature(std::string(name) + " is a device view with head stride " +
                     std::to_string(t->stride(2)) + " (the kernels need heads packed: stride " +
                     std::to_string(dim) + ")");
    const std::uint64_t bytes = t->device_storage()->nbytes();
    if (bytes > range)
      return feature(std::string(name) + "'s device storage (" + mib(bytes) +
                     ") exceeds maxStorageBufferRange (" + mib(range) + ")");
  }
  for (const KernelStep& step : plan.steps) {
    bool over = false;
    for (std::size_t a = 0; a < 3; ++a) over = over || step.groups[a] > caps.max_group_count[a];
    if (over)
      return feature(std::string("dispatch of (") + std::to_string(step.groups[0]) + ", " +
                     std::to_string(step.groups[1]) + ", " + std::to_string(step.groups[2]) +
                     ") workgroups of " + step.label + " exceeds maxComputeWorkGroupCount (" +
                     std::to_string(caps.max_group_count[0]) + ", " +
                     std::to_string(caps.max_group_count[1]) + ", " +
                     std::to_string(caps.max_group_count[2]) + ")");
  }
  if (sel.variant == Variant::flash_rowwise &&
      (kBlockQ > caps.max_invocations || kBlockQ > caps.max_group_size[0]))
    return feature("workgroups of " + std::to_string(kBlockQ) + " invocations exceed the device's limit");
  return std::nullopt;
}

namespace {

// Where a q/k/v operand is read from: a slice and the shader's offset / batch / token strides.
struct Operand {
  rt::Slice slice;
  std::uint32_t off = 0, sb = 0, st = 0;
  bool on_device = false;
};

Operand operand(rt::Batch& batch, const TensorView& t, std::int64_t heads, std::int64_t dim,
                const char* name) {
  Operand o;
  if (t.on_device()) {
    const rt::VulkanStorage& s = rt::storage_of(t, batch.device(), name);
    o.slice = s.slice();
    o.on_device = true;
    const std::int64_t words[] = {t.device_offset(), t.stride(0), t.stride(1)};
    for (std::int64_t w : words)
      if (w < 0 || w > std::numeric_limits<std::uint32_t>::max())
        throw Error(ErrorCode::unsupported_feature,
                    std::string("Vulkan: ") + name + ": device view offsets and strides must fit in 32 bits");
    o.off = static_cast<std::uint32_t>(t.device_offset());
    o.sb = static_cast<std::uint32_t>(t.stride(0));
    o.st = static_cast<std::uint32_t>(t.stride(1));
    return o;
  }
  const std::uint64_t bytes = packed_bytes(t.dim(0) * t.dim(1) * heads * dim, dtype_size(t.dtype()));
  o.slice = batch.scratch(bytes);
  batch.upload(o.slice, 0, bytes, [&](std::byte* dst) { pack_bthd(t, dst); });
  o.sb = static_cast<std::uint32_t>(t.dim(1) * heads * dim);
  o.st = static_cast<std::uint32_t>(heads * dim);
  return o;
}

// f32 rows -> the caller's output in its dtype (bit-exact round-to-nearest-even).
void unpack_out(const float* f, std::size_t n, DType dtype, Tensor& out) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(out.data(), f, n * 4u);
      break;
    case DType::f16: {
      auto* o = out.data_as<std::uint16_t>();
      for (std::size_t i = 0; i < n; ++i) o[i] = float_to_half_bits(f[i]);
      break;
    }
    default: {
      auto* o = out.data_as<std::uint16_t>();
      for (std::size_t i = 0; i < n; ++i) o[i] = float_to_bf16_bits(f[i]);
      break;
    }
  }
}

}  // namespace

std::optional<Reason> device_limits_reason(Kernel kernel, const AttentionProblem& p,
                                           const rt::PhysicalDevice& pd) {
  return limits_reason(kernel, p, pd, select_for(kernel, p, pd));
}

void run_attention(Kernel kernel, const AttentionProblem& p, const BlockMap* map, const GpuSettings& settings,
                   AttentionBuffers& buffers) {
  std::shared_ptr<rt::Device> dev = rt::device(settings);  // backend_unavailable without a device
  const rt::PhysicalDevice pd = dev->physical();           // a copy: a check that hangs replaces dev
  std::string why;
  const std::optional<Selection> sel = checked_selection(kernel, p, pd, dev, settings, &why);
  if (!sel) throw Error(ErrorCode::gpu_error, "Vulkan: " + why);
  try {
    run_selected(kernel, p, map, dev, *sel, settings.pipeline_cache, buffers);
  } catch (const Error& e) {
    // A call slower than the timeout or a hung kernel: the next call checks the variant again,
    // under the self-check's short timeout, before trusting it.
    if (e.code() == ErrorCode::gpu_error && dev->hung()) note_call_timeout(pd, sel->variant, settings);
    throw;
  }
}

void run_selected(Kernel kernel, const AttentionProblem& p, const BlockMap* map,
                  const std::shared_ptr<rt::Device>& dev, const Selection& sel,
                  const std::string& pipeline_cache, AttentionBuffers& buffers, std::uint32_t clear_alignment,
                  bool compile_only) {
  const bool out_on_device = p.q.on_device();
  const rt::PhysicalDevice& pd = dev->physical();
  if (auto reason = limits_reason(kernel, p, pd, sel)) {
    const ErrorCode code = reason->code == ReasonCode::unsupported_dtype ? ErrorCode::unsupported_dtype
                                                                         : ErrorCode::unsupported_feature;
    throw Error(code, "Vulkan: " + reason->detail);
  }
  const std::size_t es = dtype_size(p.dtype);
  const std::size_t n_out = static_cast<std::size_t>(p.B * p.Tq * p.Hq * p.Dv);
  std::lock_guard<std::mutex> lock(dev->mutex());
  if (out_on_device)
    buffers.device_out = DeviceTensor(rt::new_storage(dev, n_out * es), p.dtype, {p.B, p.Tq, p.Hq, p.Dv});
  if (p.B == 0 || p.Tq == 0 || p.Hq == 0 || p.Tk == 0) {
    // Nothing to compute: out stays 0 (device storage is zero-filled below), lse -inf.
    if (buffers.lse)
      std::fill_n(buffers.lse->data_as<float>(), buffers.lse->numel(),
                  -std::numeric_limits<float>::infinity());
    if (out_on_device && n_out > 0) {
      const auto* s = static_cast<const rt::VulkanStorage*>(buffers.device_out.storage().get());
      rt::Batch batch(*dev, false);
      batch.zero(s->slice(), 0, s->slice().size);
      batch.submit();
    }
    return;
  }

  // The block map at the selected kernel's tile (q rows x kv keys): the caller's when it already
  // has them, else our own (from the shared cache). The GPU tiles follow the device's limits,
  // not the CPU kernels' block sizes.
  const MapTile tile = map_tile(sel);
  std::shared_ptr<const BlockMap> owned_map;
  if (map != nullptr && map->bq == tile.bq && map->bk == tile.bk && map->Tq == p.Tq && map->Tk == p.Tk &&
      (map->heads == 1 || map->heads == p.Hq)) {
    owned_map = std::shared_ptr<const BlockMap>(std::shared_ptr<const BlockMap>(), map);  // non-owning
  } else {
    owned_map = get_block_map(p.mask, p.Hq, p.Tq, p.Tk, tile.bq, tile.bk);
  }
  const TilePlan tiles = make_tile_plan(p.mask, owned_map);
  const BlockMap& bm = *tiles.map;
  const std::uint64_t bits_bytes = bm.bits.size() * sizeof(std::uint64_t);
  const std::uint64_t range = buffer_range(pd);
  if (bits_bytes > range || tiles.entries.size() * 4u > range)
    throw Error(ErrorCode::unsupported_feature, "the Vulkan block map (" +
                                                    mib(bits_bytes + tiles.entries.size() * 8u) +
                                                    ") exceeds maxStorageBufferRange (" + mib(range) + ")");

  rt::Batch batch(*dev, p.profile);
  batch.set_variant(variant_name(sel.variant));
  PushConstants pc = base_push(p, tiles);
  const Operand q = operand(batch, p.q, p.Hq, p.D, "q"), k = operand(batch, p.k, p.Hkv, p.D, "k"),
                v = operand(batch, p.v, p.Hkv, p.Dv, "v");
  pc.q_off = q.off, pc.q_sb = q.sb, pc.q_st = q.st;
  pc.k_off = k.off, pc.k_sb = k.sb, pc.k_st = k.st;
  pc.v_off = v.off, pc.v_sb = v.sb, pc.v_st = v.st;
  set_alignment_flags(pc, es);
  pc.flags &= ~(clear_alignment & (kVec | kAligned4));  // the self-check runs the call's pipelines
  const LaunchPlan plan = plan_for(p, sel, pc);
  const Sizes sz = sizes_of(p, plan);

  const rt::Slice bias = upload_array(batch, p.bias, sz.bias);
  const rt::Slice sinks = upload_array(batch, p.sinks, p.sinks ? static_cast<std::uint64_t>(p.Hq) * 4u : 0u);
  const rt::Slice seg_q = upload_array(batch, p.seg_q, sz.seg_q),
                  seg_kv = upload_array(batch, p.seg_kv, sz.seg_kv);
  const rt::Slice row_start = upload_array(batch, tiles.row_start.data(), tiles.row_start.size() * 4u);
  const rt::Slice entries = upload_array(batch, tiles.entries.data(), tiles.entries.size() * 4u);
  const rt::Slice part_index = upload_array(batch, tiles.part_index.data(), tiles.part_index.size() * 4u);
  const rt::Slice bits = upload_array(batch, bm.bits.data(), bits_bytes);
  // Scratch: vanilla_gemm's scores (then the weights; every element is written), split-KV's
  // partials.
  const rt::Slice scratch = sz.scratch > 0 ? batch.scratch(sz.scratch) : rt::Slice{};
  const rt::Slice lse = p.want_lse ? batch.scratch(sz.lse) : rt::Slice{};
  // The kernels write f32; a device output in f16 / bf16 gets a convert pass after them.
  const rt::VulkanStorage* dev_out =
      out_on_device ? static_cast<const rt::VulkanStorage*>(buffers.device_out.storage().get()) : nullptr;
  const bool convert = out_on_device && p.dtype != DType::f32;
  const rt::Slice out = dev_out != nullptr && !convert ? dev_out->slice() : batch.scratch(sz.out);

  // Descriptor bindings (shaders/attn_io.glsl), the same for every pass of the plan.
  const std::vector<rt::Binding> bindings = {q.slice, k.slice, v.slice,   out,     lse,        bias, sinks,
                                             seg_q,   seg_kv,  row_start, entries, part_index, bits, scratch};
  static_assert(kBindingCount == 14 && kBindingCount <= rt::Device::kBindings);
  const auto groups_of = [compile_only](std::uint32_t x, std::uint32_t y, std::uint32_t z) {
    return compile_only ? std::array<std::uint32_t, 3>{0, 0, 0} : std::array<std::uint32_t, 3>{x, y, z};
  };
  for (const KernelStep& step : plan.steps) {
    const auto g = groups_of(step.groups[0], step.groups[1], step.groups[2]);
    const std::uint32_t groups[3] = {g[0], g[1], g[2]};
    batch.dispatch(step.key, bindings, &step.push, sizeof step.push, groups, step.label);
  }
  if (convert) {
    rt::PipelineKey ck;
    ck.shader = rt::ShaderId::convert;
    ck.spec = {dtype_code(p.dtype)};
    ck.spec_count = 1;
    const auto n = static_cast<std::uint32_t>(n_out);
    const auto g = groups_of(static_cast<std::uint32_t>(ceil_div((n + 1) / 2, 256)), 1, 1);
    const std::uint32_t cgroups[3] = {g[0], g[1], g[2]};
    batch.dispatch(ck, {out, dev_out->slice()}, &n, sizeof n, cgroups, "convert");
  }
  if (compile_only) {
    batch.submit();
    return;
  }

  // Read-backs run only after the fence signalled success: the caller's buffers are never half
  // written.
  if (!out_on_device)
    batch.download(out, 0, n_out * 4u, [&](const std::byte* src) {
      unpack_out(reinterpret_cast<const float*>(src), n_out, p.dtype, buffers.out);
    });
  if (buffers.lse && p.want_lse)
    batch.download(lse, 0, sz.lse,
                   [&](const std::byte* src) { std::memcpy(buffers.lse->data(), src, sz.lse); });
  if (buffers.weights && sel.variant == Variant::vanilla_gemm)
    batch.download(scratch, 0, sz.scratch,
                   [&](const std::byte* src) { std::memcpy(buffers.weights->data(), src, sz.scratch); });
  batch.submit();
  dev->persist_cache(pipeline_cache);

  RunInfo& run = buffers.run;
  run.kernel = sel.kernel();
  run.kernel_detail =
      sel.detail() + (convert ? "; convert pass to " + std::string(dtype_name(p.dtype)) : "") + "; " +
      dev->data_path() +
      "; float controls: " + (dev->float_controls().empty() ? "none" : dev->float_controls()) + " on " +
      pd.info.name;
  const int on_dev = int(q.on_device) + int(k.on_device) + int(v.on_device);
  run.inputs = on_dev == 0 ? "host" : on_dev == 3 ? "device" : "mixed";
  run.output = out_on_device ? "device" : "host";
  run.bytes_to_device = batch.bytes_to_device();
  run.bytes_to_host = batch.bytes_to_host();
  if (p.profile) run.timings = batch.timings();
}

}  // namespace attnops::vulkan
