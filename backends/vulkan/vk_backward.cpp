// The backward's launch code (vk_backward.h). The algorithm and buffer layouts are in
// shaders/backward_common.glsl; the CPU kernel it mirrors is backends/cpu/tiled_backward.cpp.
//
// Three passes in one submission:
//   backward_dq     (nq, Hq, B) workgroups of 32 query rows: lz and Delta per row (the stats
//                   buffer), then dq; walks the block map's rows.
//   backward_dkdv   (nk, Hkv, B) workgroups of 32 keys (1 along an axis the bias is broadcast
//                   over: the invocation walks it, so a dbias element is summed in one place):
//                   dk, dv, dbias; walks the block map's columns (indexed here).
//   backward_dsinks (Hq) workgroups of 64, with sinks only: a fixed-order reduction per head.
// Every gradient element is written by one invocation in a fixed order: the results are the
// same on every run, without atomics.
#include "backends/vulkan/vk_backward.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/vulkan/vk_attention.h"
#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_push_common.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_tile_plan.h"

namespace attnops::vulkan {

namespace {

constexpr std::uint32_t kTile = 32;                // rows (dq) / keys (dk/dv) per workgroup = the map's tile
constexpr std::uint32_t kSinkGroup = 64;           // invocations of backward_dsinks (its `N`)
constexpr std::int64_t kMaxBackwardHeadDim = 256;  // the largest DMAX of the backward shaders
static_assert(kBlockQ == kTile && kBlockK == kTile, "the backward walks the forward's 32 x 32 tile map");

// Must match `BackwardPush` in shaders/backward_common.glsl.
struct BackwardPush {
  std::int32_t B, Tq, Tk, Hq, Hkv, D, Dv;
  float scale, soft_cap;
  std::uint32_t flags;
  std::int32_t win_left, win_right, chunk;
  std::uint32_t bias_stride_b, bias_stride_h;
  std::int32_t bias_B, bias_H;
  std::int32_t map_heads, nq, nk, words;
  std::int32_t loop_b, loop_h;
};
static_assert(sizeof(BackwardPush) <= rt::Device::kPushConstantBytes);

// One entry of a map index: (other block << 1 | full, bitset index or ~0u). Matches uvec2.
struct MapEntry {
  std::uint32_t block, part;
};
MapEntry entry(std::int64_t other, std::int32_t partial) {
  return {static_cast<std::uint32_t>(other) << 1 | (partial < 0 ? 1u : 0u),
          partial < 0 ? ~0u : static_cast<std::uint32_t>(partial)};
}

// The block map's rows (dq pass) and columns (dk/dv pass) as the shaders read them.
struct MapIndex {
  std::vector<std::uint32_t> start;
  std::vector<MapEntry> entries;
};
MapIndex row_index(const BlockMap& m) {
  MapIndex x;
  x.start.reserve(m.row_start.size());
  for (std::int64_t s : m.row_start) x.start.push_back(static_cast<std::uint32_t>(s));
  x.entries.reserve(m.blocks.size());
  for (const BlockMap::Block& b : m.blocks) x.entries.push_back(entry(b.kv, b.partial));
  return x;
}
// Column (head copy hh, kv block kb): its non-empty tiles in increasing q block order.
MapIndex column_index(const BlockMap& m) {
  MapIndex x;
  x.start.assign(static_cast<std::size_t>(m.heads * m.nk + 1), 0);
  for (std::int64_t hh = 0; hh < m.heads; ++hh)
    for (std::int64_t qb = 0; qb < m.nq; ++qb)
      for (const BlockMap::Block& b : m.row(hh, qb))
        ++x.start[static_cast<std::size_t>(hh * m.nk + b.kv + 1)];
  for (std::size_t i = 1; i < x.start.size(); ++i) x.start[i] += x.start[i - 1];
  std::vector<std::uint32_t> fill(x.start.begin(), x.start.end() - 1);
  x.entries.resize(m.blocks.size());
  for (std::int64_t hh = 0; hh < m.heads; ++hh)
    for (std::int64_t qb = 0; qb < m.nq; ++qb)
      for (const BlockMap::Block& b : m.row(hh, qb))
        x.entries[fill[static_cast<std::size_t>(hh * m.nk + b.kv)]++] = entry(qb, b.partial);
  return x;
}

// Rounds n floats to the tensor's dtype (round to nearest even, as the forward's read-back).
void store_rounded(const std::byte* src, Tensor& dst) {
  const auto* f = reinterpret_cast<const float*>(src);
  const auto n = static_cast<std::size_t>(dst.numel());
  switch (dst.dtype()) {
    case DType::f32:
      std::memcpy(dst.data(), f, n * 4u);
      break;
    case DType::f16: {
      auto* o = dst.data_as<std::uint16_t>();
      for (std::size_t i = 0; i < n; ++i) o[i] = float_to_half_bits(f[i]);
      break;
    }
    default: {
      auto* o = dst.data_as<std::uint16_t>();
      for (std::size_t i = 0; i < n; ++i) o[i] = float_to_bf16_bits(f[i]);
      break;
    }
  }
}

// Bytes of an array of 4-byte elements (f32, i32).
std::uint64_t bytes4(std::int64_t elements) {
  return static_cast<std::uint64_t>(elements) * 4u;
}

// Rows of q, k, v, dout are whole 16-byte vectors: the shaders' four-at-a-time paths (FLAG_VEC).
bool whole_vectors(const AttentionProblem& p) {
  const std::size_t es = dtype_size(p.dtype);
  return static_cast<std::size_t>(p.D) * es % 16 == 0 && static_cast<std::size_t>(p.Dv) * es % 16 == 0;
}

// llvmpipe (lavapipe) ends every loop of an invocation once it has run 65535 loop iterations in
// all (LP_MAX_TGSI_LOOP_ITERATIONS, shared by all the shader's loops): the rest of the row's keys
// and of the final write loop are skipped silently, leaving gradients unwritten. An upper bound of
// the iterations of one dq / dk-dv invocation, so that such problems go to the cpu instead. The
// vector paths' loop over the four lanes is counted; the row ops' loops over the 16-bit pairs of
// a vector are unrolled (measured: a bf16 key of D = Dv = 32 is cut off after 11000-12000 rows).
std::uint64_t backward_loop_iterations(const BackwardProblem& bp, bool vec) {
  const AttentionProblem& p = bp.fwd;
  const std::uint64_t D = static_cast<std::uint64_t>(p.D), Dv = static_cast<std::uint64_t>(p.Dv);
  const std::uint64_t elems = 16 / dtype_size(p.dtype);
  const auto step = [&](std::uint64_t n) { return (n + elems - 1) / elems; };  // 16-byte steps of a row
  const auto blocks = [](std::int64_t t) { return static_cast<std::uint64_t>((t + kTile - 1) / kTile); };
  const std::uint64_t nq = blocks(p.Tq), nk = blocks(p.Tk);
  const std::uint64_t seg_scan = p.has_segments() ? kTile : 0;
  // dq: one row against every key of its map row.
  const std::uint64_t keys = nk * kTile;
  const std::uint64_t dq = 3 * D + 2 * Dv + nk * (1 + seg_scan) +
                           (vec ? keys / 4 * (5 + 2 * step(D) + step(Dv)) : keys * (1 + 2 * D + Dv));
  // dk/dv: one key against every row of its map column (a partial tile scans its rows' mask
  // parameters), for each q head of its group and every batch / kv head a broadcast bias folds
  // onto it.
  const bool bias = p.bias != nullptr;
  const std::uint64_t outer = (bias && bp.bias_B == 1 && p.B > 1 ? static_cast<std::uint64_t>(p.B) : 1u) *
                              (bias && bp.bias_H == 1 && p.Hkv > 1 ? static_cast<std::uint64_t>(p.Hkv) : 1u);
  const std::uint64_t group = static_cast<std::uint64_t>(p.Hq / std::max<std::int64_t>(p.Hkv, 1));
  const std::uint64_t rows = nq * kTile;
  const std::uint64_t dkdv =
      outer * (2 + 3 * (D + Dv) +
               group * (1 + nq * (1 + kTile + seg_scan) +
                        (vec ? rows / 4 * (5 + 2 * step(D) + 2 * step(Dv)) : rows * (1 + 2 * D + 2 * Dv))));
  return std::max(dq, dkdv);
}

// The bound can undercount the loops the compiled shader runs by a few percent (a dq row of D 32,
// Dv 13 is cut off between 800 and 810 keys, where the bound says 62.6k and 65.0k): a margin.
constexpr std::uint64_t kSoftwareLoopBudget = 65535u * 4u / 5u;

}  // namespace

std::optional<Reason> backward_limits_reason(const BackwardProblem& bp, const rt::PhysicalDevice& pd) {
  const AttentionProblem& p = bp.fwd;
  for (const auto& [name, t] : {std::pair{"q", &p.q}, std::pair{"k", &p.k}, std::pair{"v", &p.v},
                                std::pair{"out", &bp.out}, std::pair{"dout", &bp.dout}})
    if (t->on_device())
      return Reason{ReasonCode::unsupported_feature,
                    std::string(name) + " is a device tensor (the Vulkan backward reads host tensors)"};
  // The forward's limits (dtype, q/k/v/bias/segment buffers, q-block dispatch, 32-bit indices)
  // hold for the dq pass, which has the forward's shape.
  if (auto r = device_limits_reason(Kernel::flash, p, pd)) return r;
  const auto feature = [](std::string detail) { return Reason{ReasonCode::unsupported_feature, detail}; };
  // The backward shaders keep a row in private arrays of DMAX <= 256 floats; the tiled forward
  // kernels take head dims up to kMaxHeadDim (512), so this limit is the backward's own.
  if (p.D > kMaxBackwardHeadDim || p.Dv > kMaxBackwardHeadDim)
    return feature("head_dim D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) +
                   " (the Vulkan backward takes head dims up to " + std::to_string(kMaxBackwardHeadDim) +
                   ")");
  const std::uint64_t range = buffer_range(pd);
  const std::size_t es = dtype_size(p.dtype);
  const std::pair<const char*, std::uint64_t> buffers[] = {
      {"out", packed_bytes(p.B * p.Tq * p.Hq * p.Dv, es)},
      {"dout", packed_bytes(p.B * p.Tq * p.Hq * p.Dv, es)},
      {"dq (f32)", bytes4(p.B * p.Tq * p.Hq * p.D)},
      {"dk (f32)", bytes4(p.B * p.Tk * p.Hkv * p.D)},
      {"dv (f32)", bytes4(p.B * p.Tk * p.Hkv * p.Dv)},
      {"row statistics (f32)", bytes4(2 * p.B * p.Hq * p.Tq)},
      {"dbias (f32)", bytes4(bp.bias_B * bp.bias_H * p.Tq * p.Tk)},
  };
  for (const auto& [name, bytes] : buffers) {
    if (bytes > range)
      return feature(std::string(name) + " needs " + mib(bytes) +
                     ", over the device's maxStorageBufferRange (" + mib(range) + ")");
    if (bytes > pd.caps.max_allocation)
      return feature(std::string(name) + " needs " + mib(bytes) +
                     ", over the device's maxMemoryAllocationSize (" + mib(pd.caps.max_allocation) + ")");
    if (bytes / 2 > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
      return feature(std::string(name) + " has more than 2^31 elements");
  }
  if (pd.info.software) {
    const std::uint64_t loops = backward_loop_iterations(bp, whole_vectors(p));
    if (loops > kSoftwareLoopBudget)
      return feature(
          "a backward invocation would run up to " + std::to_string(loops) +
          " loop iterations, over the software device's limit (llvmpipe stops every loop after 65535)");
  }
  const std::int64_t nk = (p.Tk + kBlockK - 1) / kBlockK;
  const auto& g = pd.caps.max_group_count;
  if (nk > g[0] || p.Hkv > g[1] || p.B > g[2] || p.Hq > g[0])
    return feature("backward dispatches of (" + std::to_string(nk) + ", " + std::to_string(p.Hkv) + ", " +
                   std::to_string(p.B) + ") and (" + std::to_string(p.Hq) +
                   ") workgroups exceed maxComputeWorkGroupCount");
  if (kSinkGroup > pd.caps.max_invocations || kSinkGroup > pd.caps.max_group_size[0])
    return feature("workgroups of " + std::to_string(kSinkGroup) + " invocations exceed the device's limit");
  return std::nullopt;
}

void launch_backward(const BackwardProblem& bp, const GpuSettings& settings, GradientBuffers& grads) {
  const AttentionProblem& p = bp.fwd;
  const std::shared_ptr<rt::Device> dev = rt::device(settings);  // backend_unavailable without a device
  const rt::PhysicalDevice& pd = dev->physical();
  if (auto reason = backward_limits_reason(bp, pd)) {
    const ErrorCode code = reason->code == ReasonCode::unsupported_dtype ? ErrorCode::unsupported_dtype
                                                                         : ErrorCode::unsupported_feature;
    throw Error(code, "Vulkan: " + reason->detail);
  }
  if (p.B == 0 || p.Tq == 0 || p.Tk == 0 || p.Hq == 0) return;  // every gradient is 0 (zero-filled)

  // The forward's tile map (32 x 32, from the shared cache): rows for dq, columns for dk/dv.
  const std::shared_ptr<const BlockMap> map = get_block_map(p.mask, p.Hq, p.Tq, p.Tk, kBlockQ, kBlockK);
  const BlockMap& bm = *map;
  const MapIndex rows = row_index(bm), cols = column_index(bm);
  const std::uint64_t range = buffer_range(pd);
  const std::uint64_t bits_bytes = bm.bits.size() * 8u, bits_t_bytes = bm.bits_t.size() * 8u;
  if (std::max({bits_bytes, bits_t_bytes, rows.entries.size() * 8u}) > range)
    throw Error(ErrorCode::unsupported_feature, "the Vulkan block map (" + mib(bits_bytes + bits_t_bytes) +
                                                    ") exceeds maxStorageBufferRange (" + mib(range) + ")");

  BackwardPush pc{};
  fill_problem_push(p, param_mask(p.mask), pc);
  const std::size_t es = dtype_size(p.dtype);
  if (whole_vectors(p)) pc.flags |= kVec;
  pc.bias_B = static_cast<std::int32_t>(std::max<std::int64_t>(bp.bias_B, 1));
  pc.bias_H = static_cast<std::int32_t>(std::max<std::int64_t>(bp.bias_H, 1));
  pc.map_heads = static_cast<std::int32_t>(bm.heads);
  pc.nq = static_cast<std::int32_t>(bm.nq);
  pc.nk = static_cast<std::int32_t>(bm.nk);
  pc.words = static_cast<std::int32_t>(bm.words_per_row * 2);  // uint64 -> uint words
  if (bm.words_per_col != bm.words_per_row)
    throw Error(ErrorCode::internal, "vulkan backward: a 32 x 32 map has one word per row and per column");
  // A broadcast bias: one invocation sums a dbias element over every batch / kv head.
  pc.loop_b = p.bias && bp.bias_B == 1 && p.B > 1 ? 1 : 0;
  pc.loop_h = p.bias && bp.bias_H == 1 && p.Hkv > 1 ? 1 : 0;

  const std::int64_t dmax_need = std::max(p.D, p.Dv);
  const std::uint32_t dmax = dmax_need <= 64 ? 64u : dmax_need <= 128 ? 128u : 256u;
  const auto key = [&](rt::ShaderId shader, std::uint32_t local) {
    rt::PipelineKey k;
    k.shader = shader;
    k.spec = {local, dtype_code(p.dtype), dmax, kTile};
    k.spec_count = 4;
    return k;
  };

  std::lock_guard<std::mutex> lock(dev->mutex());
  rt::Batch batch(*dev, p.profile);
  const auto packed = [&](const TensorView& t, std::int64_t heads, std::int64_t dim) {
    const std::uint64_t bytes = packed_bytes(t.dim(0) * t.dim(1) * heads * dim, es);
    rt::Slice s = batch.scratch(bytes);
    batch.upload(s, 0, bytes, [&](std::byte* dst) { pack_bthd(t, dst); });
    return s;
  };
  const rt::Slice q = packed(p.q, p.Hq, p.D), k = packed(p.k, p.Hkv, p.D), v = packed(p.v, p.Hkv, p.Dv);
  const rt::Slice out = packed(bp.out, p.Hq, p.Dv), dout = packed(bp.dout, p.Hq, p.Dv);
  const std::int64_t rows_total = p.B * p.Hq * p.Tq;
  const rt::Slice lse = upload_array(batch, bp.lse, bytes4(rows_total));
  const rt::Slice bias = upload_array(batch, p.bias, bias_elements(p) * 4u);
  const rt::Slice sinks = upload_array(batch, p.sinks, p.sinks ? bytes4(p.Hq) : 0u);
  const rt::Slice seg_q = upload_array(batch, p.seg_q, p.has_segments() ? bytes4(p.B * p.Tq) : 0u);
  const rt::Slice seg_kv = upload_array(batch, p.seg_kv, p.has_segments() ? bytes4(p.B * p.Tk) : 0u);
  const rt::Slice row_start = upload_array(batch, rows.start.data(), rows.start.size() * 4u);
  const rt::Slice row_entries = upload_array(batch, rows.entries.data(), rows.entries.size() * 8u);
  const rt::Slice col_start = upload_array(batch, cols.start.data(), cols.start.size() * 4u);
  const rt::Slice col_entries = upload_array(batch, cols.entries.data(), cols.entries.size() * 8u);
  const rt::Slice bits = upload_array(batch, bm.bits.data(), bits_bytes);
  const rt::Slice bits_t = upload_array(batch, bm.bits_t.data(), bits_t_bytes);
  const rt::Slice stats = batch.scratch(bytes4(2 * rows_total));
  const std::uint64_t dq_bytes = bytes4(grads.dq.numel()), dk_bytes = bytes4(grads.dk.numel()),
                      dv_bytes = bytes4(grads.dv.numel());
  const rt::Slice dq = batch.scratch(dq_bytes), dk = batch.scratch(dk_bytes), dv = batch.scratch(dv_bytes);
  rt::Slice dbias, dsinks;
  if (grads.dbias) {  // accumulated in place by the dk/dv pass: starts at 0
    dbias = batch.scratch(bytes4(grads.dbias->numel()));
    batch.zero(dbias, 0, bytes4(grads.dbias->numel()));
  }
  if (grads.dsinks) dsinks = batch.scratch(bytes4(p.Hq));

  const auto u32 = [](std::int64_t x) { return static_cast<std::uint32_t>(x); };
  const std::uint32_t dq_groups[3] = {u32(bm.nq), u32(p.Hq), u32(p.B)};
  batch.dispatch(
      key(rt::ShaderId::backward_dq, kTile),
      {q, k, v, dout, bias, seg_q, seg_kv, row_start, row_entries, bits, stats, out, lse, sinks, dq}, &pc,
      sizeof pc, dq_groups, "backward_dq");
  const std::uint32_t dkdv_groups[3] = {u32(bm.nk), pc.loop_h ? 1u : u32(p.Hkv), pc.loop_b ? 1u : u32(p.B)};
  batch.dispatch(key(rt::ShaderId::backward_dkdv, kTile),
                 {q, k, v, dout, bias, seg_q, seg_kv, col_start, col_entries, bits_t, stats, dk, dv, dbias},
                 &pc, sizeof pc, dkdv_groups, "backward_dkdv");
  if (grads.dsinks) {
    const std::uint32_t sink_groups[3] = {u32(p.Hq), 1, 1};
    const rt::Slice none;  // bound to the dummy
    batch.dispatch(key(rt::ShaderId::backward_dsinks, kSinkGroup),
                   {none, none, none, none, none, none, none, none, none, none, stats, sinks, dsinks}, &pc,
                   sizeof pc, sink_groups, "backward_dsinks");
  }

  // Read-backs run only after the fence signalled success: the gradients are never half written.
  batch.download(dq, 0, dq_bytes, [&](const std::byte* src) { store_rounded(src, grads.dq); });
  batch.download(dk, 0, dk_bytes, [&](const std::byte* src) { store_rounded(src, grads.dk); });
  batch.download(dv, 0, dv_bytes, [&](const std::byte* src) { store_rounded(src, grads.dv); });
  if (grads.dbias)
    batch.download(dbias, 0, bytes4(grads.dbias->numel()), [&](const std::byte* src) {
      std::memcpy(grads.dbias->data(), src, grads.dbias->nbytes());
    });
  if (grads.dsinks)
    batch.download(dsinks, 0, bytes4(p.Hq), [&](const std::byte* src) {
      std::memcpy(grads.dsinks->data(), src, grads.dsinks->nbytes());
    });
  batch.submit();
  dev->persist_cache(settings.pipeline_cache);

  RunInfo& run = grads.run;
  run.kernel = "backward";
  run.kernel_detail = std::string("FlashAttention-2 backward: dq pass + dk/dv pass") +
                      (grads.dsinks ? " + dsinks pass" : "") + ", " + std::to_string(kTile) + "x" +
                      std::to_string(kTile) + " tiles, DMAX " + std::to_string(dmax) +
                      (pc.loop_b || pc.loop_h ? ", broadcast dbias summed per key invocation" : "") + ", " +
                      dev->data_path() + ", float controls: " +
                      (dev->float_controls().empty() ? "none" : dev->float_controls()) + " on " +
                      pd.info.name;
  run.inputs = "host";
  run.output = "host";
  run.bytes_to_device = batch.bytes_to_device();
  run.bytes_to_host = batch.bytes_to_host();
  if (p.profile) run.timings = batch.timings();
}

}  // namespace attnops::vulkan
