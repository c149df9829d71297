// The attention kernels' launch code on the runtime (vk_attention.h).
#include "backends/vulkan/vk_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "attnops/error.h"
#include "backends/common/block_map_impl.h"
#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_storage.h"
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
  std::uint32_t q_off, k_off, v_off;
  std::uint32_t q_sb, q_st, k_sb, k_st, v_sb, v_st;
};
static_assert(sizeof(PushConstants) <= rt::Device::kPushConstantBytes);

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

}  // namespace

// Helpers shared with the other launch files (declared in vk_attention.h).

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
  const std::uint64_t range = pd.caps.max_storage_buffer_range;
  return cap > 0 && cap < range ? cap : range;
}

namespace {

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

}  // namespace

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

namespace {

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
  const std::int64_t nq = ceil_div(p.Tq, kBlockQ);
  if (nq > pd.caps.max_group_count[0] || p.Hq > pd.caps.max_group_count[1] ||
      p.B > pd.caps.max_group_count[2])
    return feature("dispatch of (" + std::to_string(nq) + ", " + std::to_string(p.Hq) + ", " +
                   std::to_string(p.B) + ") workgroups exceeds maxComputeWorkGroupCount (" +
                   std::to_string(pd.caps.max_group_count[0]) + ", " +
                   std::to_string(pd.caps.max_group_count[1]) + ", " +
                   std::to_string(pd.caps.max_group_count[2]) + ")");
  if (kBlockQ > pd.caps.max_invocations || kBlockQ > pd.caps.max_group_size[0])
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

}  // namespace

// A host array uploaded into a scratch slice (an invalid slice, bound to the dummy, when empty).
rt::Slice upload_array(rt::Batch& batch, const void* data, std::uint64_t bytes) {
  if (data == nullptr || bytes == 0) return {};
  rt::Slice s = batch.scratch(bytes);
  batch.upload(s, 0, bytes, [&](std::byte* dst) { std::memcpy(dst, data, bytes); });
  return s;
}

void run_attention(Kernel kernel, const AttentionProblem& p, const BlockMap* map, const GpuSettings& settings,
                   AttentionBuffers& buffers) {
  const bool out_on_device = p.q.on_device();
  const std::shared_ptr<rt::Device> dev = rt::device(settings);  // backend_unavailable without a device
  const rt::PhysicalDevice& pd = dev->physical();
  if (auto reason = device_limits_reason(kernel, p, pd)) {
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
  pc.bias_stride_b = static_cast<std::uint32_t>(p.bias_stride_b);
  pc.bias_stride_h = static_cast<std::uint32_t>(p.bias_stride_h);
  pc.map_heads = static_cast<std::int32_t>(bm.heads);
  pc.nq = static_cast<std::int32_t>(bm.nq);
  pc.words_per_row = static_cast<std::int32_t>(bm.words_per_row * 2);  // uint64 -> uint words

  const std::int64_t dmax_need = std::max(p.D, p.Dv);
  const Sizes sz = sizes_of(kernel, p, range);
  const bool scores = sz.scratch > 0;
  rt::PipelineKey key;
  key.shader = scores ? rt::ShaderId::vanilla : rt::ShaderId::flash;
  // Specialization constants 4 and 5 (exact head dims: loops of constant length) stay 0: on
  // lavapipe the fully unrolled variants cost far more to compile than they save.
  key.spec = {static_cast<std::uint32_t>(kBlockQ), dtype_code(p.dtype),
              dmax_need <= 64    ? 64u
              : dmax_need <= 128 ? 128u
                                 : 256u,
              static_cast<std::uint32_t>(kBlockK)};
  key.spec_count = 4;

  rt::Batch batch(*dev, p.profile);
  const Operand q = operand(batch, p.q, p.Hq, p.D, "q"), k = operand(batch, p.k, p.Hkv, p.D, "k"),
                v = operand(batch, p.v, p.Hkv, p.Dv, "v");
  pc.q_off = q.off, pc.q_sb = q.sb, pc.q_st = q.st;
  pc.k_off = k.off, pc.k_sb = k.sb, pc.k_st = k.st;
  pc.v_off = v.off, pc.v_sb = v.sb, pc.v_st = v.st;
  // Rows fetched 16 bytes at a time when every row starts on a 16-byte boundary.
  const auto aligned = [&](std::uint64_t elements) { return elements * es % 16 == 0; };
  if (aligned(static_cast<std::uint64_t>(p.D)) && aligned(static_cast<std::uint64_t>(p.Dv)) &&
      aligned(q.off) && aligned(k.off) && aligned(v.off) && aligned(q.sb) && aligned(q.st) && aligned(k.sb) &&
      aligned(k.st) && aligned(v.sb) && aligned(v.st))
    pc.flags |= kVec;

  const rt::Slice bias = upload_array(batch, p.bias, sz.bias);
  const rt::Slice sinks = upload_array(batch, p.sinks, p.sinks ? static_cast<std::uint64_t>(p.Hq) * 4u : 0u);
  const rt::Slice seg_q = upload_array(batch, p.seg_q, sz.seg_q),
                  seg_kv = upload_array(batch, p.seg_kv, sz.seg_kv);
  const rt::Slice row_start = upload_array(batch, plan.row_start.data(), plan.row_start.size() * 4u);
  const rt::Slice entries = upload_array(batch, plan.entries.data(), plan.entries.size() * 4u);
  const rt::Slice part_index = upload_array(batch, plan.part_index.data(), plan.part_index.size() * 4u);
  const rt::Slice bits = upload_array(batch, bm.bits.data(), bits_bytes);
  rt::Slice scratch;
  if (scores) {  // vanilla only writes the scores of listed tiles: the rest must read back as 0
    scratch = batch.scratch(sz.scratch);
    batch.zero(scratch, 0, sz.scratch);
  }
  const rt::Slice lse = p.want_lse ? batch.scratch(sz.lse) : rt::Slice{};
  // The attention pass writes f32; a device output in f16 / bf16 gets a convert pass after it.
  const rt::VulkanStorage* dev_out =
      out_on_device ? static_cast<const rt::VulkanStorage*>(buffers.device_out.storage().get()) : nullptr;
  const bool convert = out_on_device && p.dtype != DType::f32;
  const rt::Slice out = dev_out != nullptr && !convert ? dev_out->slice() : batch.scratch(sz.out);

  const std::uint32_t groups[3] = {static_cast<std::uint32_t>(bm.nq), static_cast<std::uint32_t>(p.Hq),
                                   static_cast<std::uint32_t>(p.B)};
  batch.dispatch(key,
                 {q.slice, k.slice, v.slice, out, lse, bias, sinks, seg_q, seg_kv, row_start, entries,
                  part_index, bits, scratch},
                 &pc, sizeof pc, groups, scores ? "vanilla" : "flash");
  if (convert) {
    rt::PipelineKey ck;
    ck.shader = rt::ShaderId::convert;
    ck.spec = {dtype_code(p.dtype)};
    ck.spec_count = 1;
    const auto n = static_cast<std::uint32_t>(n_out);
    const std::uint32_t cgroups[3] = {static_cast<std::uint32_t>(ceil_div((n + 1) / 2, 256)), 1, 1};
    batch.dispatch(ck, {out, dev_out->slice()}, &n, sizeof n, cgroups, "convert");
  }

  // Read-backs run only after the fence signalled success: the caller's buffers are never half
  // written.
  if (!out_on_device)
    batch.download(out, 0, n_out * 4u, [&](const std::byte* src) {
      const auto* f = reinterpret_cast<const float*>(src);
      switch (p.dtype) {
        case DType::f32:
          std::memcpy(buffers.out.data(), f, n_out * 4u);
          break;
        case DType::f16: {
          auto* o = buffers.out.data_as<std::uint16_t>();
          for (std::size_t i = 0; i < n_out; ++i) o[i] = float_to_half_bits(f[i]);
          break;
        }
        default: {
          auto* o = buffers.out.data_as<std::uint16_t>();
          for (std::size_t i = 0; i < n_out; ++i) o[i] = float_to_bf16_bits(f[i]);
          break;
        }
      }
    });
  if (buffers.lse && p.want_lse)
    batch.download(lse, 0, sz.lse,
                   [&](const std::byte* src) { std::memcpy(buffers.lse->data(), src, sz.lse); });
  if (buffers.weights && scores)
    batch.download(scratch, 0, sz.scratch,
                   [&](const std::byte* src) { std::memcpy(buffers.weights->data(), src, sz.scratch); });
  batch.submit();
  dev->persist_cache(settings.pipeline_cache);

  RunInfo& run = buffers.run;
  run.kernel = scores ? "vanilla" : "flash";
  run.kernel_detail = std::string(scores ? "scores materialised" : "online softmax") + ", " +
                      std::to_string(kBlockQ) + "x" + std::to_string(kBlockK) + " tiles, DMAX " +
                      std::to_string(key.spec[2]) +
                      (convert ? ", convert pass to " + std::string(dtype_name(p.dtype)) : "") +
                      (dev->direct_access() ? ", device memory mapped (no copies)" : ", staged copies") +
                      " on " + pd.info.name;
  const int on_dev = int(q.on_device) + int(k.on_device) + int(v.on_device);
  run.inputs = on_dev == 0 ? "host" : on_dev == 3 ? "device" : "mixed";
  run.output = out_on_device ? "device" : "host";
  run.bytes_to_device = batch.bytes_to_device();
  run.bytes_to_host = batch.bytes_to_host();
  if (p.profile) run.timings = batch.timings();
}

}  // namespace attnops::vulkan
