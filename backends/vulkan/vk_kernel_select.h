// Which Vulkan kernel variant runs a problem, with which tile sizes, and why the better variants
// were not taken: a pure function of a device description, the shaders of this build and the
// problem's shape (no Vulkan calls), so tests inject devices this machine does not have.
//
// Variants, best first:
//   flash_coopmat_khr / flash_coopmat_nv  f16 inputs: Q K^T and P V as 16x16x16 f16 -> f32
//                     cooperative-matrix products (flash_coopmat.comp), prefill-sized problems
//   flash_decode      any dtype, decode-shaped problems (<= 16 query rows per kv head): a workgroup
//                     splits the keys over teams of lanes, 16-byte loads straight from global
//                     memory, the teams combined by log-sum-exp (flash_decode.comp); + split-KV
//   flash_subgroup    any dtype: subgroup tiles with the head dim split over lanes, K/V staged in
//                     shared memory (flash_tiled.comp); + split-KV with a log-sum-exp merge when
//                     the problem has too few workgroups for the device (decode)
//   flash_rowwise     one invocation per query row (flash.comp): the fallback
//   vanilla_gemm      vanilla's own path: tiled GEMM Q K^T, a row softmax (= the weights), tiled
//                     GEMM P V, for vanilla with weights (or forced); vanilla without weights
//                     runs the flash variants (the same function, no scores in memory)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/dtype.h"
#include "backends/vulkan/vk_device_desc.h"

namespace attnops::vulkan {

enum class Variant {
  flash_coopmat_khr,
  flash_coopmat_nv,
  flash_decode,
  flash_subgroup,
  flash_rowwise,
  vanilla_gemm
};
const char* variant_name(Variant v);
std::optional<Variant> parse_variant(const std::string& name);

// What the selection needs of a problem.
struct ProblemShape {
  bool vanilla = false;       // vanilla's forward (else flash / blocksparse)
  bool want_weights = false;  // vanilla only
  bool scores_fit = true;     // vanilla's scores [B, Hq, Tq, Tk] f32 fit one storage buffer
  bool per_head_map = false;  // the static mask differs between heads (a per-head block map)
  DType dtype = DType::f32;
  std::int64_t B = 1, Tq = 1, Tk = 1, Hq = 1, Hkv = 1, D = 1, Dv = 1;
  std::uint64_t buffer_range = UINT64_MAX;  // the largest storage buffer (split-KV partials)
};

// flash_tiled.comp (specialization constants and launch shape).
struct SubgroupTiles {
  std::uint32_t wg = 0;            // invocations per workgroup
  std::uint32_t ds = 1;            // lanes per row team (head dim split)
  std::uint32_t rpt = 1;           // rows per team
  std::uint32_t bc = 32;           // keys per kv tile (= the block map's bk)
  std::uint32_t ku = 8;            // keys per online-softmax step (divides bc)
  bool one_subgroup = false;       // the workgroup is one subgroup: subgroup barriers suffice
  std::uint32_t dk4 = 1, dv4 = 1;  // vec4 of q / v per lane
  std::uint32_t q_rows = 1;        // query positions per workgroup (= the block map's bq)
  std::uint32_t head_rows = 1;     // q heads per workgroup (of one kv head)
  std::uint32_t nsplit = 1;        // split-KV chunks per row (1 = no split)
  std::uint32_t shared_bytes = 0;
};

// flash_decode.comp (specialization constants and launch shape).
struct DecodeTiles {
  std::uint32_t wg = 0;             // invocations per workgroup (teams x ds)
  std::uint32_t ds = 1;             // lanes per team (head dim split, 8 elements per chunk)
  std::uint32_t dk8 = 1, dv8 = 1;   // 8-element chunks of q / v per lane
  std::uint32_t bc = 32;            // keys per kv tile (= the block map's bk)
  std::uint32_t ku = 1;             // keys per team per tile (bc / teams)
  std::uint32_t rows = 1;           // the R of the shader: rows per workgroup at most
  std::uint32_t max_subgroups = 1;  // subgroups per workgroup at most (shared arrays)
  std::uint32_t q_rows = 1;         // query positions per workgroup (= the block map's bq)
  std::uint32_t head_rows = 1;      // q heads per workgroup (of one kv head)
  std::uint32_t nsplit = 1;         // split-KV chunks per row (1 = no split)
  std::uint32_t shared_bytes = 0;
};

// flash_coopmat.comp.
struct CoopTiles {
  std::uint32_t subgroup = 32;          // lanes per subgroup (required when size control is enabled)
  std::uint32_t subgroups = 4;          // per workgroup; each owns 16 query rows
  std::uint32_t bc = 32;                // keys per kv tile (= the block map's bk)
  std::uint32_t dpad = 16, dvpad = 16;  // head dims padded to 16
  std::uint32_t q_rows = 16, head_rows = 1;
  std::uint32_t shared_bytes = 0;
};

// vanilla_{scores,softmax,pv}.comp: fixed 32 x 32 tiles (shared memory use is small).
struct GemmTiles {
  std::uint32_t tm = 32, tn = 32;  // score tile (= the block map's bq x bk)
  std::uint32_t wg = 64;           // 8 x 8 invocations, 4 x 4 outputs each
};

// Test / bench override of the choice (vulkan_debug.h: set_kernel_override, or the environment
// ATTNOPS_VK_KERNEL=<variant> and ATTNOPS_VK_TILES="ds=2,rpt=1,bc=16,ku=4,rows=16,split=4").
struct KernelOverride {
  std::optional<Variant> variant;
  std::uint32_t ds = 0, rpt = 0, bc = 0, ku = 0, rows = 0, nsplit = 0;  // 0 = derived
  bool empty() const {
    return !variant && ds == 0 && rpt == 0 && bc == 0 && ku == 0 && rows == 0 && nsplit == 0;
  }
};

// A variant the caller rules out for this problem, and why (the self-check's failures:
// "selftest_failed: max error 0.5 at out[0, 3, 1, 7]").
struct DisabledVariant {
  Variant variant;
  std::string why;
};

struct Selection {
  Variant variant = Variant::flash_rowwise;
  bool exhausted = false;       // every variant that could run the problem is disabled (`variant` unusable)
  SubgroupTiles subgroup;       // flash_subgroup
  DecodeTiles decode;           // flash_decode
  CoopTiles coop;               // flash_coopmat_*
  GemmTiles gemm;               // vanilla_gemm
  bool required_size = false;   // pipeline requires the subgroup size (size control)
  bool full_subgroups = false;  // pipeline requires full subgroups
  std::vector<std::string> not_taken;  // "flash_coopmat_nv: <why>" for each better variant passed over
  std::string selfcheck;               // the self-check of this configuration, e.g. "passed" (vk_selfcheck.h)
  // The kernel name reported in RunInfo ("flash_subgroup+split_kv", ...) and the detail:
  // tiles, then the reasons above.
  std::string kernel() const;
  std::string detail() const;
  bool split_kv() const {
    return (variant == Variant::flash_subgroup && subgroup.nsplit > 1) ||
           (variant == Variant::flash_decode && decode.nsplit > 1);
  }
};

// Head dims the tiled kernels take (padded inside the kernel); flash_rowwise takes up to 256.
inline constexpr std::int64_t kMaxHeadDim = 512;
inline constexpr std::int64_t kMaxRowwiseHeadDim = 256;
// Split-KV chunks per row at most (flash_subgroup; attn_merge reads them all per row).
inline constexpr std::uint64_t kMaxSplits = 256;
// Vanilla without weights at or below this many query rows is a decode: split-KV flash.
inline constexpr std::int64_t kDecodeMaxTq = 16;
// flash_decode is taken (on a GPU) for problems of at most this many query rows per kv head
// (Tq x the GQA group): at most four of its workgroups (4 rows each) read each kv head's keys.
inline constexpr std::int64_t kDecodeMaxRowsPerKvHead = 16;

// The choice for `p` on `dev` with the shaders of `caps`, passing over `disabled` variants (each
// named in not_taken with its reason). Never fails: flash_rowwise is the last resort (the caller
// rejects head dims no variant takes); when it is disabled too the selection is `exhausted`.
Selection select_kernel(const DeviceDesc& dev, const BuildCaps& caps, const ProblemShape& p,
                        const KernelOverride& force = {}, const std::vector<DisabledVariant>& disabled = {});

// Each variant with whether this build holds it and whether `dev` could run it (a canonical f16
// prefill, B1 H16 T4096 D128, forced to it), as `attnops info` lists them:
// "flash_coopmat_nv: built; this device: no (the device does not offer ...)".
std::vector<std::string> variant_support(const DeviceDesc& dev, const BuildCaps& caps);

// Parses ATTNOPS_VK_TILES ("ds=2,rpt=1,bc=16,ku=4,rows=16,split=4"); unknown keys are ignored.
KernelOverride parse_tiles(const std::string& text, KernelOverride base = {});

}  // namespace attnops::vulkan
