// The Vulkan backend's entry points (vulkan_backend.h): device queries, input checks, and run(),
// which selects the kernel variant (vk_kernel_select.h), uploads one problem, executes the
// variant's launch plan (vk_launch.h) in one submission, and reads back.
#include "backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "attnops/error.h"
#include "backends/common/block_map_impl.h"
#include "backends/vulkan/vk_kernel_select.h"
#include "backends/vulkan/vk_launch.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_tile_plan.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Bytes of a packed q/k/v array, rounded up to whole 16-byte vectors (the shaders read them as
// uvec4 arrays).
std::uint64_t packed_bytes(std::int64_t elements, std::size_t elem_size) {
  return (static_cast<std::uint64_t>(elements) * elem_size + 15u) / 16u * 16u;
}

std::uint64_t bias_elements(const AttentionProblem& p) {
  if (!p.bias) return 0;
  return static_cast<std::uint64_t>((p.B - 1) * p.bias_stride_b + (p.Hq - 1) * p.bias_stride_h + p.Tq * p.Tk);
}

// The largest storage buffer the backend plans with: the device's maxStorageBufferRange, or
// less under debug::set_max_buffer_bytes.
std::uint64_t buffer_range(const rt::PhysicalDevice& pd) {
  const std::uint64_t cap = debug::max_buffer_bytes();
  const std::uint64_t range = pd.info.max_storage_buffer_range;
  return cap > 0 && cap < range ? cap : range;
}

// The kernel variant run() takes for `p` on `pd` (vk_kernel_select.h), under the test / bench
// override (vulkan_debug.h).
Selection selection_for(Kernel kernel, const AttentionProblem& p, const rt::PhysicalDevice& pd) {
  ProblemShape shape;
  shape.vanilla = kernel == Kernel::vanilla;
  shape.want_weights = p.want_weights;
  shape.buffer_range = buffer_range(pd);
  shape.scores_fit = static_cast<std::uint64_t>(p.B * p.Hq * p.Tq * p.Tk) * 4u <= shape.buffer_range;
  shape.per_head_map = p.mask.head_dependent();
  shape.dtype = p.dtype;
  shape.B = p.B, shape.Tq = p.Tq, shape.Tk = p.Tk, shape.Hq = p.Hq, shape.Hkv = p.Hkv, shape.D = p.D,
  shape.Dv = p.Dv;
  return select_kernel(pd.desc, build_caps(), shape, debug::kernel_override());
}

// The launch plan of `sel` with the block map's row count but no map yet (for the checks).
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

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
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

// Why the device `pd` cannot run `p` with `kernel` as `sel` plans it, or nullopt. Shared by
// check_inputs and run.
std::optional<Reason> device_limits_reason(Kernel kernel, const AttentionProblem& p,
                                           const rt::PhysicalDevice& pd, const Selection& sel) {
  const auto feature = [](std::string detail) { return Reason{ReasonCode::unsupported_feature, detail}; };
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
    if (bytes / 2 > static_cast<std::uint64_t>(kIntMax))  // 16-bit element indices must fit in an int
      return feature(std::string(name) + " has more than 2^31 elements");
  }
  for (const KernelStep& step : plan.steps) {
    bool over = false;
    for (int a = 0; a < 3; ++a)
      over = over || step.groups[static_cast<std::size_t>(a)] > pd.max_group_count[a];
    if (over)
      return feature(std::string("dispatch of (") + std::to_string(step.groups[0]) + ", " +
                     std::to_string(step.groups[1]) + ", " + std::to_string(step.groups[2]) +
                     ") workgroups of " + shader_name(step.key.shader) +
                     " exceeds maxComputeWorkGroupCount (" + std::to_string(pd.max_group_count[0]) + ", " +
                     std::to_string(pd.max_group_count[1]) + ", " + std::to_string(pd.max_group_count[2]) +
                     ")");
  }
  return std::nullopt;
}

const rt::PhysicalDevice* selected_device(const GpuSettings& settings, std::string* why) {
  const int index = rt::select_device(settings, why);
  if (index < 0) return nullptr;
  return &rt::instance().devices()[static_cast<std::size_t>(index)];
}

// Copies a BTHD view (any outer strides, innermost contiguous) into a packed [B, T, H, D] array.
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

}  // namespace

bool compiled_in() {
  return true;
}

std::vector<GpuDeviceInfo> list_devices(const GpuSettings& settings) {
  try {
    return rt::list_devices(settings);
  } catch (const Error&) {
    return {};  // no loader / no instance: no devices
  }
}

Availability availability(const GpuSettings& settings) {
  std::string why;
  const rt::PhysicalDevice* pd = selected_device(settings, &why);
  if (pd == nullptr) return {false, why};
  return {true, "Vulkan device [" + std::to_string(pd->info.index) + "] " + pd->info.name + " (" +
                    pd->info.type + ", Vulkan " + pd->info.api_version + ")"};
}

std::optional<Reason> check_inputs(Kernel kernel, const AttentionProblem& p, const GpuSettings& settings) {
  std::string why;
  const rt::PhysicalDevice* pd = selected_device(settings, &why);
  if (pd == nullptr) return Reason{ReasonCode::backend_unavailable, why};
  return device_limits_reason(kernel, p, *pd, selection_for(kernel, p, *pd));
}

void run(Kernel kernel, const AttentionProblem& p, const BlockMap* map, const GpuSettings& settings,
         AttentionBuffers& buffers) {
  if (p.B == 0 || p.Tq == 0 || p.Hq == 0) return;
  if (p.Tk == 0) {  // no keys: every row is fully masked
    if (buffers.lse)
      std::fill_n(buffers.lse->data_as<float>(), buffers.lse->numel(),
                  -std::numeric_limits<float>::infinity());
    return;
  }
  rt::Context& ctx = rt::context(settings);  // backend_unavailable when no device qualifies
  const rt::PhysicalDevice& pd = ctx.physical();
  const Selection sel = selection_for(kernel, p, pd);
  if (auto reason = device_limits_reason(kernel, p, pd, sel)) {
    const ErrorCode code = reason->code == ReasonCode::unsupported_dtype ? ErrorCode::unsupported_dtype
                                                                         : ErrorCode::unsupported_feature;
    throw Error(code, "Vulkan: " + reason->detail);
  }

  // The block map at the kernel's tile sizes: the caller's when it already has them, else our own
  // (from the shared cache). The GPU tiles are set by the selected kernel (workgroup rows, keys
  // per staged tile), not by the CPU kernels' block sizes.
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
  const LaunchPlan plan = plan_for(p, sel, base_push(p, tiles));
  const Sizes sz = sizes_of(p, plan);

  std::lock_guard<std::mutex> lock(ctx.mutex());
  VkDevice dev = ctx.device();
  std::vector<rt::DispatchStep> steps(plan.steps.size());
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    steps[i].pipeline = ctx.pipeline(plan.steps[i].key);
    steps[i].push = &plan.steps[i].push;
    steps[i].push_bytes = sizeof(PushConstants);
    for (int a = 0; a < 3; ++a) steps[i].groups[a] = plan.steps[i].groups[static_cast<std::size_t>(a)];
  }
  ctx.persist_cache(settings.pipeline_cache);

  // One buffer per binding; absent inputs get a small dummy (every binding of the layout must
  // be valid), writable ones their own so no two bindings alias.
  static_assert(kBindingCount == rt::Context::kBindings);
  rt::Buffer bufs[rt::Context::kBindings];
  const std::uint64_t bytes[rt::Context::kBindings] = {sz.q,
                                                       sz.k,
                                                       sz.v,
                                                       sz.out,
                                                       sz.lse,
                                                       sz.bias,
                                                       p.sinks ? static_cast<std::uint64_t>(p.Hq) * 4u : 0u,
                                                       sz.seg_q,
                                                       sz.seg_kv,
                                                       tiles.row_start.size() * 4u,
                                                       tiles.entries.size() * 4u,
                                                       tiles.part_index.size() * 4u,
                                                       bits_bytes,
                                                       sz.scratch};
  for (std::uint32_t b = 0; b < rt::Context::kBindings; ++b)
    bufs[b] = ctx.make_buffer(std::max<std::uint64_t>(bytes[b], 16u));

  pack_bthd(p.q, bufs[bQ].mapped);
  pack_bthd(p.k, bufs[bK].mapped);
  pack_bthd(p.v, bufs[bV].mapped);
  if (p.bias) std::memcpy(bufs[bBias].mapped, p.bias, sz.bias);
  if (p.sinks) std::memcpy(bufs[bSinks].mapped, p.sinks, static_cast<std::size_t>(p.Hq) * 4u);
  if (p.has_segments()) {
    std::memcpy(bufs[bSegQ].mapped, p.seg_q, sz.seg_q);
    std::memcpy(bufs[bSegKv].mapped, p.seg_kv, sz.seg_kv);
  }
  std::memcpy(bufs[bRowStart].mapped, tiles.row_start.data(), tiles.row_start.size() * 4u);
  if (!tiles.entries.empty()) {
    std::memcpy(bufs[bEntries].mapped, tiles.entries.data(), tiles.entries.size() * 4u);
    std::memcpy(bufs[bPartIndex].mapped, tiles.part_index.data(), tiles.part_index.size() * 4u);
  }
  if (bits_bytes > 0) std::memcpy(bufs[bBits].mapped, bm.bits.data(), bits_bytes);
  for (const rt::Buffer& b : bufs) rt::flush(dev, b);

  if (debug::inject_fault_active())
    throw Error(ErrorCode::gpu_error,
                "Vulkan: injected fault before vkQueueSubmit (VK_ERROR_DEVICE_LOST, "
                "debug::set_inject_fault or ATTNOPS_VK_INJECT_FAULT=1)");

  ctx.dispatch_steps(bufs, steps.data(), steps.size());

  // Success: only now are the caller's buffers written.
  rt::invalidate(dev, bufs[bOut]);
  const auto* out = static_cast<const float*>(bufs[bOut].mapped);
  const std::size_t n_out = static_cast<std::size_t>(p.B * p.Tq * p.Hq * p.Dv);
  switch (p.dtype) {
    case DType::f32:
      std::memcpy(buffers.out.data(), out, n_out * 4u);
      break;
    case DType::f16: {
      auto* o = buffers.out.data_as<std::uint16_t>();
      for (std::size_t i = 0; i < n_out; ++i) o[i] = float_to_half_bits(out[i]);
      break;
    }
    default: {
      auto* o = buffers.out.data_as<std::uint16_t>();
      for (std::size_t i = 0; i < n_out; ++i) o[i] = float_to_bf16_bits(out[i]);
      break;
    }
  }
  if (buffers.lse && p.want_lse) {
    rt::invalidate(dev, bufs[bLse]);
    std::memcpy(buffers.lse->data(), bufs[bLse].mapped, sz.lse);
  }
  if (buffers.weights && sel.variant == Variant::vanilla_gemm) {
    rt::invalidate(dev, bufs[bScratch]);
    std::memcpy(buffers.weights->data(), bufs[bScratch].mapped, buffers.weights->numel() * 4u);
  }
  buffers.run = RunInfo{sel.kernel(), sel.detail()};
}

}  // namespace attnops::vulkan
