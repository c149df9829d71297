// The Vulkan backend's entry points (vulkan_backend.h): device queries, input checks, and run(),
// which uploads one problem, dispatches flash.comp or vanilla.comp once, and reads back.
#include "backends/vulkan/vulkan_backend.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "attnops/error.h"
#include "backends/common/block_map_impl.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_tile_plan.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan {

namespace {

constexpr std::int64_t kMaxHeadDim = 256;  // the shaders' private arrays (DMAX) go up to 256

// Must match `PushConstants` in shaders/common.glsl.
struct PushConstants {
  std::int32_t B, Tq, Tk, Hq, Hkv, D, Dv;
  float scale, soft_cap;
  std::uint32_t flags;
  std::int32_t win_left, win_right, chunk;
  std::uint32_t bias_stride_b, bias_stride_h;
  std::int32_t map_heads, nq, words_per_row;
};
static_assert(sizeof(PushConstants) == rt::Context::kPushConstantBytes);

enum Flag : std::uint32_t {
  kCausal = 1,
  kParamMask = 2,
  kSegments = 4,
  kBias = 8,
  kSinks = 16,
  kLse = 32,
  kSoftCap = 64,
  kVec = 128,
};

// Descriptor bindings (shaders/common.glsl).
enum Binding : std::uint32_t {
  bQ,
  bK,
  bV,
  bOut,
  bLse,
  bBias,
  bSinks,
  bSegQ,
  bSegKv,
  bRowStart,
  bEntries,
  bPartIndex,
  bBits,
  bScratch,
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

std::uint32_t dtype_code(DType t) {
  return t == DType::f32 ? 0u : t == DType::f16 ? 1u : 2u;
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

// Vanilla materialises the scores ([B, Hq, Tq, Tk] f32, which are the weights) when the caller
// wants the weights or when they fit in one buffer; otherwise (no weights, scores over the
// range) it runs the one-pass online softmax of flash.comp instead, which computes the same
// function without a scores buffer.
bool materialises_scores(Kernel kernel, const AttentionProblem& p, std::uint64_t range) {
  if (kernel != Kernel::vanilla) return false;
  return p.want_weights || static_cast<std::uint64_t>(p.B * p.Hq * p.Tq * p.Tk) * 4u <= range;
}

// The device buffers of one run whose sizes depend only on the problem (not on the map).
struct Sizes {
  std::uint64_t q, k, v, out, lse, bias, seg_q, seg_kv, scratch;
};
Sizes sizes_of(Kernel kernel, const AttentionProblem& p, std::uint64_t range) {
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
  s.scratch =
      materialises_scores(kernel, p, range) ? static_cast<std::uint64_t>(p.B * p.Hq * p.Tq * p.Tk) * 4u : 0;
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

// Why the device `pd` cannot run `p` with `kernel`, or nullopt. Shared by check_inputs and run.
std::optional<Reason> device_limits_reason(Kernel kernel, const AttentionProblem& p,
                                           const rt::PhysicalDevice& pd) {
  const auto feature = [](std::string detail) { return Reason{ReasonCode::unsupported_feature, detail}; };
  if (!is_float(p.dtype))
    return Reason{ReasonCode::unsupported_dtype,
                  "q/k/v dtype " + std::string(dtype_name(p.dtype)) + " (expected f32, f16 or bf16)"};
  if (p.D > kMaxHeadDim || p.Dv > kMaxHeadDim)
    return feature("head_dim D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) +
                   " (the Vulkan shaders take head dims up to " + std::to_string(kMaxHeadDim) + ")");
  if (p.want_weights && kernel != Kernel::vanilla)
    return feature(std::string("attention weights are computed by vanilla only, not by ") +
                   kernel_name(kernel));
  // Every index the shaders compute is a 32-bit int.
  const std::int64_t kIntMax = std::numeric_limits<std::int32_t>::max();
  if (p.Tq + p.Tk > kIntMax) return feature("Tq + Tk must fit in 32 bits");
  const std::uint64_t range = buffer_range(pd);
  const Sizes s = sizes_of(kernel, p, range);
  const std::pair<const char*, std::uint64_t> buffers[] = {
      {"q", s.q},           {"k", s.k},           {"v", s.v},
      {"out (f32)", s.out}, {"lse", s.lse},       {"bias", s.bias},
      {"seg_q", s.seg_q},   {"seg_kv", s.seg_kv}, {"vanilla weights [B, Hq, Tq, Tk] f32", s.scratch},
  };
  for (const auto& [name, bytes] : buffers) {
    if (bytes > range)
      return feature(std::string(name) + " needs " + mib(bytes) +
                     ", over the device's maxStorageBufferRange (" + mib(range) + ")");
    if (bytes / 2 > static_cast<std::uint64_t>(kIntMax))  // 16-bit element indices must fit in an int
      return feature(std::string(name) + " has more than 2^31 elements");
  }
  const std::int64_t nq = ceil_div(p.Tq, kBlockQ);
  if (nq > pd.max_group_count[0] || p.Hq > pd.max_group_count[1] || p.B > pd.max_group_count[2])
    return feature("dispatch of (" + std::to_string(nq) + ", " + std::to_string(p.Hq) + ", " +
                   std::to_string(p.B) + ") workgroups exceeds maxComputeWorkGroupCount (" +
                   std::to_string(pd.max_group_count[0]) + ", " + std::to_string(pd.max_group_count[1]) +
                   ", " + std::to_string(pd.max_group_count[2]) + ")");
  if (kBlockQ > pd.info.max_workgroup_invocations || kBlockQ > pd.max_group_size_x)
    return feature("workgroups of " + std::to_string(kBlockQ) + " invocations exceed the device's limit");
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

std::int32_t clip32(std::int64_t v, std::int64_t hi) {
  return static_cast<std::int32_t>(std::min(v, hi));
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
  return device_limits_reason(kernel, p, *pd);
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
  if (auto reason = device_limits_reason(kernel, p, pd)) {
    const ErrorCode code = reason->code == ReasonCode::unsupported_dtype ? ErrorCode::unsupported_dtype
                                                                         : ErrorCode::unsupported_feature;
    throw Error(code, "Vulkan: " + reason->detail);
  }

  // The block map at the GPU's tile sizes: the caller's when it already has them, else our own
  // (from the shared cache). The shaders' tile sizes are set by the workgroup size and the
  // one-uint-per-row visibility masks, not by the CPU kernels' block sizes.
  std::shared_ptr<const BlockMap> owned_map;
  if (map != nullptr && map->bq == kBlockQ && map->bk == kBlockK && map->Tq == p.Tq && map->Tk == p.Tk &&
      (map->heads == 1 || map->heads == p.Hq)) {
    owned_map = std::shared_ptr<const BlockMap>(std::shared_ptr<const BlockMap>(), map);  // non-owning
  } else {
    owned_map = get_block_map(p.mask, p.Hq, p.Tq, p.Tk, kBlockQ, kBlockK);
  }
  const TilePlan plan = make_tile_plan(p.mask, owned_map);
  const BlockMap& bm = *plan.map;
  const std::uint64_t bits_bytes = bm.bits.size() * sizeof(std::uint64_t);
  const std::uint64_t range = buffer_range(pd);
  if (bits_bytes > range || plan.entries.size() * 4u > range)
    throw Error(ErrorCode::unsupported_feature, "the Vulkan block map (" +
                                                    mib(bits_bytes + plan.entries.size() * 8u) +
                                                    ") exceeds maxStorageBufferRange (" + mib(range) + ")");

  PushConstants pc{};
  pc.B = static_cast<std::int32_t>(p.B);
  pc.Tq = static_cast<std::int32_t>(p.Tq);
  pc.Tk = static_cast<std::int32_t>(p.Tk);
  pc.Hq = static_cast<std::int32_t>(p.Hq);
  pc.Hkv = static_cast<std::int32_t>(p.Hkv);
  pc.D = static_cast<std::int32_t>(p.D);
  pc.Dv = static_cast<std::int32_t>(p.Dv);
  pc.scale = static_cast<float>(p.scale);
  pc.soft_cap = p.soft_cap ? static_cast<float>(*p.soft_cap) : 0.f;
  pc.win_left = pc.win_right = -1;
  if (plan.param) {
    // Bounds past the sequence act like no bound; clipping keeps the shader's int math exact.
    const std::int64_t span = p.Tq + p.Tk;
    pc.flags |= kParamMask | (plan.param->causal ? kCausal : 0u);
    if (plan.param->left >= 0) pc.win_left = clip32(plan.param->left, span);
    if (plan.param->right >= 0) pc.win_right = clip32(plan.param->right, span);
    if (plan.param->chunk > 0) pc.chunk = clip32(plan.param->chunk, std::max<std::int64_t>(p.Tk, 1));
  }
  if (p.has_segments()) pc.flags |= kSegments;
  if (p.bias) pc.flags |= kBias;
  if (p.sinks) pc.flags |= kSinks;
  if (p.want_lse) pc.flags |= kLse;
  if (p.soft_cap) pc.flags |= kSoftCap;
  // Rows of whole 16-byte vectors start 16-byte aligned in the packed buffers: fetch k and v rows
  // a vector at a time.
  const std::size_t es = dtype_size(p.dtype);
  if ((static_cast<std::size_t>(p.D) * es) % 16 == 0 && (static_cast<std::size_t>(p.Dv) * es) % 16 == 0)
    pc.flags |= kVec;
  pc.bias_stride_b = static_cast<std::uint32_t>(p.bias_stride_b);
  pc.bias_stride_h = static_cast<std::uint32_t>(p.bias_stride_h);
  pc.map_heads = static_cast<std::int32_t>(bm.heads);
  pc.nq = static_cast<std::int32_t>(bm.nq);
  pc.words_per_row = static_cast<std::int32_t>(bm.words_per_row * 2);  // uint64 -> uint words

  const std::int64_t dmax_need = std::max(p.D, p.Dv);
  const Sizes sz = sizes_of(kernel, p, range);
  const rt::PipelineKey key{sz.scratch > 0 ? rt::Shader::vanilla : rt::Shader::flash,
                            static_cast<std::uint32_t>(kBlockQ), dtype_code(p.dtype),
                            dmax_need <= 64    ? 64u
                            : dmax_need <= 128 ? 128u
                                               : 256u,
                            static_cast<std::uint32_t>(kBlockK)};

  std::lock_guard<std::mutex> lock(ctx.mutex());
  VkDevice dev = ctx.device();
  const VkPipeline pipeline = ctx.pipeline(key);
  ctx.persist_cache(settings.pipeline_cache);

  // One buffer per binding; absent inputs get a small dummy (every binding of the layout must
  // be valid), writable ones their own so no two bindings alias.
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
                                                       plan.row_start.size() * 4u,
                                                       plan.entries.size() * 4u,
                                                       plan.part_index.size() * 4u,
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
  std::memcpy(bufs[bRowStart].mapped, plan.row_start.data(), plan.row_start.size() * 4u);
  if (!plan.entries.empty()) {
    std::memcpy(bufs[bEntries].mapped, plan.entries.data(), plan.entries.size() * 4u);
    std::memcpy(bufs[bPartIndex].mapped, plan.part_index.data(), plan.part_index.size() * 4u);
  }
  if (bits_bytes > 0) std::memcpy(bufs[bBits].mapped, bm.bits.data(), bits_bytes);
  // vanilla only writes the scores of listed tiles: the rest must read back as weight 0.
  if (sz.scratch > 0) std::memset(bufs[bScratch].mapped, 0, sz.scratch);
  for (const rt::Buffer& b : bufs) rt::flush(dev, b);

  if (debug::inject_fault_active())
    throw Error(ErrorCode::gpu_error,
                "Vulkan: injected fault before vkQueueSubmit (VK_ERROR_DEVICE_LOST, "
                "debug::set_inject_fault or ATTNOPS_VK_INJECT_FAULT=1)");

  const std::uint32_t groups[3] = {static_cast<std::uint32_t>(bm.nq), static_cast<std::uint32_t>(p.Hq),
                                   static_cast<std::uint32_t>(p.B)};
  ctx.dispatch(pipeline, bufs, &pc, sizeof pc, groups);

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
  if (buffers.weights && sz.scratch > 0) {
    rt::invalidate(dev, bufs[bScratch]);
    std::memcpy(buffers.weights->data(), bufs[bScratch].mapped, sz.scratch);
  }
}

}  // namespace attnops::vulkan
