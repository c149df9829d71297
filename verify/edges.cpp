#include "verify/edges.h"

#include <algorithm>

namespace attnops::verify {

namespace {
constexpr unsigned kSeq = kSeqQ | kSeqK;
}  // namespace

const std::vector<Edge>& edge_table() {
  static const std::vector<Edge> table = {
      // Query rows.
      {"decode q_len", 1, kSeqQ, "operators: the decode fallback (q_len == 1)"},
      {"vanilla decode rows", 4, kSeqQ, "backends/cpu/vanilla_decode.h kDecodeMaxQ"},
      {"paged stream q_len", 2, kSeqQ, "include/attnops/ext/paged_problem.h kPagedStreamMaxQ"},
      {"paged stream rows", 32, kSeqQ, "include/attnops/ext/paged_problem.h kPagedStreamMaxRows (G * q_len)"},
      {"simd lanes", 16, kSeq | kHeadDim, "backends/cpu/simd16.h V16; tiled_common.h kQRows"},
      {"64-lane chunk", 64, kSeq,
       "backends/cpu/micro_kernels.h kMaxNC x 16 lanes (vanilla's 64-lane chunks)"},
      {"micro-tile rows", 6, kSeq | kHeadDim, "backends/cpu/micro_kernels.h kMaxR / kRegR"},
      {"baseline micro-tile rows", 2, kSeqK, "backends/cpu/micro_kernels.h kRegR on the baseline tier"},
      {"tiled block", 128, kSeq | kBlock,
       "operators/flash_attn2.cpp, blocksparse.cpp blocksize_q/k = 128; backends/common block map"},
      {"blocksparse seq_multiple", 256, kSeqQ, "include/attnops/metadata.h seq_multiple_of 128 (x2)"},
      {"backward flag rows", 64, kSeqQ, "backends/cpu/backward_guard.h kFlagRowsPerTask"},
      {"vk decode rows", 16, kSeqQ,
       "backends/vulkan/vk_kernel_select.h kDecodeMaxTq, kDecodeMaxRowsPerKvHead"},
      {"vk workgroup rows", 64, kSeqQ,
       "backends/vulkan/vk_kernel_tiles.cpp: 64 rows per workgroup (32 on small subgroups)"},
      // Keys.
      {"vanilla key block", 256, kSeqK, "backends/cpu/vanilla_plan.cpp convert_rows (key block) <= 256"},
      {"decode block", 32, kSeqK, "backends/cpu/vanilla_decode.cpp, paged_stream.cpp kBlock"},
      {"decode split keys", 128, kSeqK, "backends/cpu/vanilla_decode.h kMinSplitKeys"},
      {"paged split", 512, kSeqK | kSplit, "include/attnops/paged.h kDefaultKvSplitTokens"},
      {"vk kv tile", 32, kSeqK | kBlock, "backends/vulkan/vk_kernel_tiles.cpp bc = 32; GemmTiles 32 x 32"},
      {"vk software kv tile", 8, kSeqK, "backends/vulkan/vk_kernel_tiles.cpp flash_decode bc = 8 (software)"},
      {"vk softmax step", 8, kSeqK, "backends/vulkan/vk_kernel_select.h SubgroupTiles::ku = 8"},
      {"lavapipe subgroup", 8, kSeq, "lavapipe's subgroup size on AVX2 (8 lanes of 32 bits)"},
      // Head dims.
      {"vk vec4", 4, kHeadDim, "backends/vulkan shaders: q/k/v loaded as vec4"},
      {"vk decode chunk", 8, kHeadDim, "backends/vulkan/vk_kernel_tiles.cpp flash_decode 8-element chunks"},
      {"bf16 pair", 2, kHeadDim, "backends/cpu/tiled_common.h padded_d (bf16 dot: pairs along d)"},
      {"amx tile row", 32, kHeadDim | kSeqK, "backends/cpu/tiled_common.h padded_d / key_align (AMX: 32)"},
      {"head dim 64", 64, kHeadDim, "the common head dims (vk: dk4 + dv4 <= 16 vec4 for 2 rows per team)"},
      {"head dim 128", 128, kHeadDim,
       "vk_kernel_tiles.cpp: over 32 vec4 of q and o a lane pair splits a row"},
      {"rowwise head dim", 256, kHeadDim, "backends/vulkan/vk_kernel_select.h kMaxRowwiseHeadDim"},
      // Block sizes, pages, splits.
      {"block 16", 16, kBlock | kPage, "tiled kernels round bq up to 16 lanes (tiled_cpu.cpp bqp)"},
      {"block 1", 1, kBlock | kPage | kSplit, "the smallest block / page / split"},
      {"page 16", 16, kPage, "vLLM's and the README's page size"},
      {"page ahead", 2, kPage, "backends/cpu/paged_stream.cpp kPageAhead"},
      {"split 32", 32, kSplit, "one paged_stream block per split"},
      // 8-bit caches (an axis of their own: the other draws stay as they were).
      {"8-bit codes per vector", 16, kKv8,
       "backends/cpu/paged_simd.h i8x16 / fp8x16 (a partial vector through bytes16)"},
      {"8-bit dot chains", 32, kKv8, "backends/cpu/paged_simd.h kDotChains x 16 codes"},
      {"fp8 NaN scan", 32, kKv8, "backends/cpu/paged_simd.h fp8_has_nan: 32 bytes a step, then bytes"},
      {"8-bit key block", 32, kKv8, "backends/cpu/paged_stream.cpp kBlock (one scale load per block)"},
      {"vk 8-bit word", 4, kKv8,
       "backends/vulkan/shaders/paged_io.glsl: 8-bit codes read four to a uint word"},
      {"vk 8-bit load", 8, kKv8, "backends/vulkan/vk_paged.cpp: 8-byte loads of 8-bit pools"},
  };
  return table;
}

std::vector<Edge> dynamic_edges(unsigned axis, const ShapeContext& c) {
  std::vector<Edge> out;
  const std::int64_t G = std::max<std::int64_t>(1, c.group);
  if (axis & kSeqQ) {
    // vanilla_plan.cpp: qc = max(16, 128 / G) query rows per task; M = G * qc rows.
    out.push_back(
        {"vanilla q chunk", std::max<std::int64_t>(16, 128 / G), kSeqQ, "backends/cpu/vanilla_plan.cpp qc"});
    out.push_back({"vanilla q chunk x2", 2 * std::max<std::int64_t>(16, 128 / G), kSeqQ,
                   "backends/cpu/vanilla_plan.cpp qc"});
    // Paged: a sequence is a stream item while G * q_len <= 32.
    out.push_back({"paged stream rows / G", std::max<std::int64_t>(1, 32 / G), kSeqQ,
                   "include/attnops/ext/paged_problem.h kPagedStreamMaxRows / G"});
  }
  if (axis & kSeqK) {
    // call_threads.h: decode takes a second thread at 2 MiB of K/V per thread.
    const std::int64_t per_key = std::max<std::int64_t>(1, c.B * c.Hkv * (c.D + c.Dv) * c.elem_bytes);
    for (std::int64_t t : {1, 2})
      out.push_back({"decode 2 MiB per thread",
                     std::max<std::int64_t>(1, t * (std::int64_t{2} << 20) / per_key), kSeqK,
                     "backends/cpu/call_threads.h kMinDecodeBytesPerThread"});
  }
  return out;
}

std::vector<std::int64_t> edge_values(unsigned axis, const ShapeContext& ctx, std::int64_t lo,
                                      std::int64_t hi) {
  std::vector<std::int64_t> v;
  const auto add = [&](std::int64_t e) {
    for (std::int64_t x : {e - 1, e, e + 1, 2 * e - 1, 2 * e, 2 * e + 1})
      if (x >= lo && x <= hi) v.push_back(x);
  };
  for (const Edge& e : edge_table())
    if (e.axes & axis) add(e.value);
  for (const Edge& e : dynamic_edges(axis, ctx)) add(e.value);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::int64_t draw_size(Rng& rng, unsigned axis, const ShapeContext& ctx, std::int64_t lo, std::int64_t hi) {
  if (hi <= lo) return lo;
  if (rng.chance(0.75)) {
    std::vector<std::int64_t> base;
    for (const Edge& e : edge_table())
      if (e.axes & axis) base.push_back(e.value);
    for (const Edge& e : dynamic_edges(axis, ctx)) base.push_back(e.value);
    if (!base.empty()) {
      std::int64_t x = rng.pick(base);
      const double m = rng.real();
      x *= m < 0.6 ? 1 : m < 0.8 ? 2 : m < 0.9 ? 3 : rng.uniform(4, 8);  // one tile, or a few
      x += rng.uniform(-1, 1);
      if (x >= lo && x <= hi) return x;
    }
  }
  return lo == 0 && rng.chance(0.1) ? 0 : rng.log_uniform(std::max<std::int64_t>(1, lo), hi);
}

}  // namespace attnops::verify
