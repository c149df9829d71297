// The kernel variant and tile selection (vk_kernel_select.h) as a pure function, on injected
// device descriptions: lavapipe as this machine reports it, an NVIDIA H100 as the GPU recipe
// reported it (driver 580), a wave64 GPU, a device without subgroup shuffles, a small one. No
// Vulkan device is needed; the last test checks the description read from the real device.
#include <gtest/gtest.h>

#include <string>

#include "attnops/ext/problem.h"
#include "backends/vulkan/vk_kernel_select.h"
#if ATTNOPS_TEST_VULKAN_BUILT
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_launch.h"
#endif
#include "tests/support/testing.h"
#include "tests/vulkan/injected_devices.h"
#include "tests/vulkan/select_shapes.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

using vulkan::BuildCaps;
using vulkan::CoopMatShape;
using vulkan::DeviceDesc;
using vulkan::KernelOverride;
using vulkan::MatType;
using vulkan::ProblemShape;
using vulkan::Selection;
using vulkan::Variant;

TEST(VulkanSelect, LavapipeTakesTheSubgroupKernelInItsCpuShape) {
  const Selection s = vulkan::select_kernel(lavapipe(), kDebian12, prefill(DType::f32, 64, 512, 8, 8));
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_EQ(s.kernel(), "flash_subgroup");
  // One subgroup per workgroup (no workgroup barrier), whole rows per lane, 8 rows per lane on a
  // prefill-sized problem, 4 on a small one.
  EXPECT_EQ(s.subgroup.wg, 8u);
  EXPECT_TRUE(s.subgroup.one_subgroup);
  EXPECT_EQ(s.subgroup.ds, 1u);
  EXPECT_EQ(s.subgroup.rpt, 8u);
  EXPECT_EQ(s.subgroup.ku, 1u);
  EXPECT_EQ(s.subgroup.q_rows, 64u);
  const Selection small = vulkan::select_kernel(lavapipe(), kDebian12, prefill(DType::f32, 64, 100, 2, 2));
  EXPECT_EQ(small.subgroup.rpt, 4u);
  EXPECT_EQ(small.subgroup.q_rows, 32u);
  EXPECT_EQ(s.subgroup.bc, 32u);
  EXPECT_EQ(s.subgroup.nsplit, 1u);
  EXPECT_LE(s.subgroup.shared_bytes, 32768u);
  EXPECT_TRUE(mentions(s, "flash_coopmat_khr: not compiled in")) << s.detail();
  EXPECT_TRUE(mentions(s, "flash_coopmat_nv: the device does not offer VK_NV_cooperative_matrix"))
      << s.detail();
  // Wider heads: fewer rows per lane, smaller tiles within the 32 KiB of shared memory.
  const Selection wide = vulkan::select_kernel(lavapipe(), kDebian12, prefill(DType::f32, 512, 512, 8, 8));
  EXPECT_EQ(wide.variant, Variant::flash_subgroup) << wide.detail();
  EXPECT_EQ(wide.subgroup.rpt, 1u);
  EXPECT_EQ(wide.subgroup.bc, 8u);
  EXPECT_EQ(wide.subgroup.shared_bytes, 32768u);
}

// On a software device a decode without GQA (one row per kv head) would busy one lane of eight:
// the row-wise kernel there, saying why; with GQA 8 the subgroup kernel and split-KV; on a GPU
// the decode kernel (or the subgroup kernel without it) regardless.
TEST(VulkanSelect, LavapipeDecodeWithoutGqaTakesTheRowwiseKernel) {
  const Selection mha = vulkan::select_kernel(lavapipe(), kDebian12, decode(DType::f32, 4096, 16, 16));
  EXPECT_EQ(mha.variant, Variant::flash_rowwise) << mha.detail();
  EXPECT_NE(mha.detail().find("flash_subgroup: software device with 1 row(s) per kv head"), std::string::npos)
      << mha.detail();
  const Selection gqa = vulkan::select_kernel(lavapipe(), kDebian12, decode(DType::f32, 4096, 16, 2));
  EXPECT_EQ(gqa.kernel(), "flash_subgroup+split_kv") << gqa.detail();
  const Selection gpu = vulkan::select_kernel(h100(), kDebian12, decode(DType::f32, 4096, 16, 16));
  EXPECT_EQ(gpu.variant, Variant::flash_decode) << gpu.detail();
  const Selection gpu_sub =
      vulkan::select_kernel(h100(), kDebian12, decode(DType::f32, 4096, 16, 16), {}, kNoDecodeKernel);
  EXPECT_EQ(gpu_sub.variant, Variant::flash_subgroup) << gpu_sub.detail();
  KernelOverride force;
  force.variant = Variant::flash_subgroup;
  EXPECT_EQ(vulkan::select_kernel(lavapipe(), kDebian12, decode(DType::f32, 4096, 16, 16), force).variant,
            Variant::flash_subgroup);
}

TEST(VulkanSelect, H100F16TakesCooperativeMatricesKhrFirst) {
  const Selection khr = vulkan::select_kernel(h100(), kNewGlslc, prefill(DType::f16));
  EXPECT_EQ(khr.variant, Variant::flash_coopmat_khr) << khr.detail();
  EXPECT_EQ(khr.coop.subgroup, 32u);
  EXPECT_EQ(khr.coop.subgroups, 4u);
  EXPECT_EQ(khr.coop.q_rows, 64u);
  EXPECT_EQ(khr.coop.dpad, 128u);
  EXPECT_LE(khr.coop.shared_bytes, 49152u);
  EXPECT_TRUE(khr.required_size);
  EXPECT_TRUE(khr.not_taken.empty()) << khr.detail();
  // Debian 12's glslc: the NV path, and the decision says why not KHR.
  const Selection nv = vulkan::select_kernel(h100(), kDebian12, prefill(DType::f16));
  EXPECT_EQ(nv.variant, Variant::flash_coopmat_nv) << nv.detail();
  EXPECT_TRUE(
      mentions(nv, "flash_coopmat_khr: not compiled in (this build's glslc lacks GL_KHR_cooperative_matrix"))
      << nv.detail();
  // A device that lists no 16x16x16 f16 -> f32 shape.
  DeviceDesc dev = h100();
  dev.coopmat_nv_shapes = {{16, 16, 16, MatType::f16, MatType::f16, MatType::f16, MatType::f16}};
  const Selection none = vulkan::select_kernel(dev, kDebian12, prefill(DType::f16));
  EXPECT_EQ(none.variant, Variant::flash_subgroup) << none.detail();
  EXPECT_TRUE(mentions(none, "flash_coopmat_nv: the device lists no 16x16x16")) << none.detail();
}

TEST(VulkanSelect, H100SubgroupPathForF32AndBf16) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Selection s = vulkan::select_kernel(h100(), kNewGlslc, prefill(t));
    EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
    EXPECT_TRUE(mentions(s, t == DType::f32 ? "f32 inputs" : "bf16 inputs")) << s.detail();
    // The head dim is split over 4 lanes, 2 rows per team, 64 rows per workgroup, 8-key steps,
    // tiles within half the shared memory.
    EXPECT_EQ(s.subgroup.ds, 4u);
    EXPECT_EQ(s.subgroup.rpt, 2u);
    EXPECT_EQ(s.subgroup.wg, 128u);
    EXPECT_EQ(s.subgroup.q_rows, 64u);
    EXPECT_EQ(s.subgroup.ku, 8u);
    EXPECT_FALSE(s.subgroup.one_subgroup);
    EXPECT_LE(s.subgroup.shared_bytes, 49152u / 2);
    EXPECT_EQ(s.subgroup.nsplit, 1u);
  }
}

TEST(VulkanSelect, DecodePacksTheGqaHeadsAndSplitsTheKeys) {
  const Selection s =
      vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f16, 32768, 16, 2), {}, kNoDecodeKernel);
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_TRUE(s.split_kv());
  EXPECT_EQ(s.kernel(), "flash_subgroup+split_kv");
  EXPECT_TRUE(mentions(s, "fewer than 16 query rows")) << s.detail();
  EXPECT_EQ(s.subgroup.q_rows, 1u);
  EXPECT_EQ(s.subgroup.head_rows, 8u);  // the 8 q heads of a kv head share the staged tiles
  // 2 one-subgroup workgroups without splitting; 8 subgroups on each of 132 SMs wanted, within
  // a quarter of the tiles and the cap.
  ASSERT_EQ(s.subgroup.wg, 32u);
  const std::uint64_t tiles = (32768 + s.subgroup.bc - 1) / s.subgroup.bc;
  EXPECT_EQ(s.subgroup.nsplit, std::min<std::uint64_t>({132u * 8u / 2u, tiles / 4, vulkan::kMaxSplits}));
  EXPECT_GT(s.subgroup.nsplit, 64u);  // the old cap left 128 workgroups on 132 SMs
  // Lavapipe: the same packing, fewer chunks.
  const Selection lp = vulkan::select_kernel(lavapipe(), kDebian12, decode(DType::f32, 32768, 8, 1, 64));
  EXPECT_TRUE(lp.split_kv()) << lp.detail();
  EXPECT_EQ(lp.subgroup.head_rows, 8u);
  EXPECT_EQ(lp.subgroup.rpt, 1u);
  EXPECT_EQ(lp.subgroup.nsplit, 16u);
  // The partials must fit a buffer: a small range leaves fewer chunks.
  ProblemShape tight = decode(DType::f32, 32768, 8, 1, 64);
  tight.buffer_range = 8 * 66 * 4 * 4;  // 4 chunks of [8 heads, 64 + 2] f32
  EXPECT_EQ(vulkan::select_kernel(lavapipe(), kDebian12, tight).subgroup.nsplit, 4u);
  // Short caches are not split.
  EXPECT_FALSE(vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f16, 100, 16, 2)).split_kv());
  // Per-head masks: one head per workgroup.
  ProblemShape per_head = decode(DType::f16, 4096, 16, 2);
  per_head.per_head_map = true;
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, per_head, {}, kNoDecodeKernel).subgroup.head_rows, 1u);
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, per_head).decode.head_rows, 1u);
}

TEST(VulkanSelect, VanillaTakesItsGemmPathOnlyForTheWeights) {
  ProblemShape p = prefill(DType::f32, 64, 512, 8, 8);
  p.vanilla = true;
  // No weights asked: the flash kernels compute the same function without the scores in memory.
  Selection s = vulkan::select_kernel(lavapipe(), kDebian12, p);
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_TRUE(mentions(s, "vanilla_gemm: no weights asked")) << s.detail();
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, p).variant, Variant::flash_subgroup);
  p.want_weights = true;
  EXPECT_EQ(vulkan::select_kernel(lavapipe(), kDebian12, p).variant, Variant::vanilla_gemm);
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, p).variant, Variant::vanilla_gemm);
  p.want_weights = false;
  KernelOverride gemm;  // forced, it still runs (the kernel tests use this)
  gemm.variant = Variant::vanilla_gemm;
  EXPECT_EQ(vulkan::select_kernel(lavapipe(), kDebian12, p, gemm).variant, Variant::vanilla_gemm);
  p.scores_fit = false;
  s = vulkan::select_kernel(lavapipe(), kDebian12, p);
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_TRUE(mentions(s, "vanilla_gemm: the scores")) << s.detail();
  ProblemShape d = decode(DType::f16, 4096, 16, 4);
  d.vanilla = true;
  s = vulkan::select_kernel(h100(), kNewGlslc, d);
  EXPECT_EQ(s.variant, Variant::flash_decode) << s.detail();
  EXPECT_TRUE(s.split_kv());
  EXPECT_TRUE(mentions(s, "vanilla_gemm: decode-shaped (Tq=1")) << s.detail();
  d.want_weights = true;  // the weights come from the GEMM path only
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, d).variant, Variant::vanilla_gemm);
}

TEST(VulkanSelect, HeadDimsAndSharedMemoryLimits) {
  // Cooperative matrices take head dims up to 256; 512 goes to the subgroup kernel.
  const Selection big = vulkan::select_kernel(h100(), kNewGlslc, prefill(DType::f16, 512));
  EXPECT_EQ(big.variant, Variant::flash_subgroup) << big.detail();
  EXPECT_TRUE(mentions(big, "head dims up to 256")) << big.detail();
  EXPECT_EQ(big.subgroup.ds, 8u);
  EXPECT_EQ(big.subgroup.dk4 + big.subgroup.dv4, 32u);
  // D = 256 fits 48 KiB with fewer rows per workgroup.
  const Selection d256 = vulkan::select_kernel(h100(), kNewGlslc, prefill(DType::f16, 256));
  EXPECT_EQ(d256.variant, Variant::flash_coopmat_khr) << d256.detail();
  EXPECT_TRUE(d256.coop.subgroups < 4u || d256.coop.bc < 32u) << d256.detail();
  EXPECT_LE(d256.coop.shared_bytes, 49152u);
  // Odd head dims are padded inside the kernels.
  const Selection odd = vulkan::select_kernel(h100(), kNewGlslc, prefill(DType::f16, 80));
  EXPECT_EQ(odd.coop.dpad, 80u);
  const Selection odd40 = vulkan::select_kernel(h100(), kNewGlslc, prefill(DType::f16, 40));
  EXPECT_EQ(odd40.coop.dpad, 48u);
  // 8 KiB of shared memory cannot hold 4 keys of D = 512: the row-wise fallback, saying why.
  DeviceDesc small = lavapipe();
  small.shared_memory_bytes = 8192;
  const Selection s = vulkan::select_kernel(small, kNoCoopmat, prefill(DType::f32, 512, 64, 1, 1));
  EXPECT_EQ(s.variant, Variant::flash_rowwise) << s.detail();
  EXPECT_TRUE(mentions(s, "flash_subgroup: D=512, Dv=512 need")) << s.detail();
}

TEST(VulkanSelect, DevicesWithoutShufflesOrWithWideSubgroups) {
  DeviceDesc no_shuffle = h100();
  no_shuffle.subgroup_shuffle = false;
  const Selection s = vulkan::select_kernel(no_shuffle, kNoCoopmat, prefill(DType::f32, 128));
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_EQ(s.subgroup.ds, 1u);
  const Selection w = vulkan::select_kernel(wave64(), kNewGlslc, prefill(DType::f16, 128));
  EXPECT_EQ(w.variant, Variant::flash_subgroup) << w.detail();
  EXPECT_EQ(w.subgroup.wg % 64u, 0u);  // whole subgroups of the widest size
  EXPECT_LE(w.subgroup.ds, 32u);       // within the narrowest size
  EXPECT_TRUE(mentions(w, "the device does not offer VK_KHR_cooperative_matrix")) << w.detail();
}

// The cooperative-matrix kernel maps lanes to matrix rows by its subgroup size,
// so it runs only where every subgroup has exactly that many lanes and is full; flash_subgroup's
// teams of several lanes are numbered by subgroup lane, which needs full subgroups too.
TEST(VulkanSelect, SubgroupSizeAssumptionsAreEnforced) {
  // Size control without full subgroups, and no size control with sizes 16 to 32: no coopmat.
  DeviceDesc partial = h100();
  partial.full_subgroups = false;
  Selection s = vulkan::select_kernel(partial, kDebian12, prefill(DType::f16));
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_TRUE(mentions(s, "flash_coopmat_nv: the subgroup size is not guaranteed")) << s.detail();
  EXPECT_GT(s.subgroup.ds, 1u) << s.detail();  // one subgroup size: workgroups are whole subgroups
  DeviceDesc varying = h100();
  varying.subgroup_size_control = false;
  varying.min_subgroup_size = 16;
  s = vulkan::select_kernel(varying, kDebian12, prefill(DType::f16));
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_TRUE(mentions(s, "flash_coopmat_nv: the subgroup size is not guaranteed")) << s.detail();
  // Varying sizes without full subgroups: a lane per row (no teams).
  varying.full_subgroups = false;
  s = vulkan::select_kernel(varying, kDebian12, prefill(DType::f32));
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_EQ(s.subgroup.ds, 1u) << s.detail();
  // No size control but a single size (min == max == 32) and full subgroups: coopmat, no
  // required size in the pipeline.
  DeviceDesc single = h100();
  single.subgroup_size_control = false;
  s = vulkan::select_kernel(single, kDebian12, prefill(DType::f16));
  EXPECT_EQ(s.variant, Variant::flash_coopmat_nv) << s.detail();
  EXPECT_FALSE(s.required_size);
  // The H100 itself: teams of several lanes (its subgroups are full and of one size).
  s = vulkan::select_kernel(h100(), kNoCoopmat, prefill(DType::f32));
  EXPECT_GT(s.subgroup.ds, 1u) << s.detail();
}

// Shapes that give the cooperative-matrix kernel (no split-KV) too few
// workgroups for the device go to a split-KV variant (flash_decode for <= 16 rows per kv head);
// decode fills a large GPU.
TEST(VulkanSelect, ShortQueriesOverLongContextsFillTheDevice) {
  // B1 Hq8 Hkv1 Tq2 Tk32768 f16: 16 rows per kv head (coopmat could take it) in 1 workgroup.
  ProblemShape spec = decode(DType::f16, 32768, 8, 1);
  spec.Tq = 2;
  const Selection s = vulkan::select_kernel(h100(), kNewGlslc, spec);
  EXPECT_EQ(s.kernel(), "flash_decode+split_kv") << s.detail();
  EXPECT_TRUE(mentions(s, "flash_coopmat_khr: 1 workgroup(s) for a target of 264 and no split-KV"))
      << s.detail();
  // 4 rows per workgroup (2 positions x 2 heads): 4 workgroups, split to 2 per SM.
  EXPECT_EQ(s.decode.q_rows * s.decode.head_rows, 4u) << s.detail();
  EXPECT_GE(4u * s.decode.nsplit, 264u) << s.detail();
  // With flash_decode ruled out, flash_subgroup splits.
  const Selection sub = vulkan::select_kernel(h100(), kNewGlslc, spec, {}, kNoDecodeKernel);
  EXPECT_EQ(sub.kernel(), "flash_subgroup+split_kv") << sub.detail();
  EXPECT_GE(sub.subgroup.nsplit * 1u, 132u) << sub.detail();  // at least one workgroup per SM
  // B1 H16 Tq16 Tk32768: 16 workgroups on coopmat; split instead (16 rows per kv head: decode).
  ProblemShape chunk = prefill(DType::f16, 128, 16);
  chunk.Tk = 32768;
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, chunk).kernel(), "flash_decode+split_kv");
  chunk.Hkv = 8;  // 32 rows per kv head: flash_subgroup's rows
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, chunk).kernel(), "flash_subgroup+split_kv");
  chunk.Hkv = 16;
  // Long prefill keeps coopmat; so does a short context (nothing to split) and a forced variant.
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, prefill(DType::f16)).variant,
            Variant::flash_coopmat_khr);
  ProblemShape short_ctx = chunk;
  short_ctx.Tk = 128;
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, short_ctx).variant, Variant::flash_coopmat_khr);
  vulkan::KernelOverride force;
  force.variant = Variant::flash_coopmat_nv;
  EXPECT_EQ(vulkan::select_kernel(h100(), kDebian12, chunk, force).variant, Variant::flash_coopmat_nv);
  // Decode B1 H16 Tk32768 D128 (MHA): 16 workgroups of 4 subgroups, split to ~8 subgroups per SM.
  const Selection d = vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f16, 32768, 16, 16));
  EXPECT_EQ(d.kernel(), "flash_decode+split_kv") << d.detail();
  EXPECT_GE(16u * d.decode.nsplit * (d.decode.wg / 32u), 132u * 8u) << d.detail();
  const Selection ds =
      vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f16, 32768, 16, 16), {}, kNoDecodeKernel);
  EXPECT_EQ(ds.kernel(), "flash_subgroup+split_kv") << ds.detail();
  EXPECT_GE(16u * ds.subgroup.nsplit * (ds.subgroup.wg / 32u), 132u * 8u) << ds.detail();
  // An unknown compute-unit count keeps the old target of 64 workgroups.
  DeviceDesc unknown = h100();
  unknown.compute_units = 0;
  const Selection u = vulkan::select_kernel(unknown, kNewGlslc, decode(DType::f16, 32768, 16, 16));
  EXPECT_EQ(u.decode.nsplit, 4u) << u.detail();
}

TEST(VulkanSelect, OverridesForceVariantsAndTiles) {
  KernelOverride rowwise;
  rowwise.variant = Variant::flash_rowwise;
  Selection s = vulkan::select_kernel(lavapipe(), kDebian12, prefill(DType::f32, 64, 512, 8, 8), rowwise);
  EXPECT_EQ(s.variant, Variant::flash_rowwise);
  EXPECT_TRUE(mentions(s, "forced flash_rowwise")) << s.detail();
  KernelOverride coop;
  coop.variant = Variant::flash_coopmat_nv;  // lavapipe has no cooperative matrices
  s = vulkan::select_kernel(lavapipe(), kDebian12, prefill(DType::f16, 64, 512, 8, 8), coop);
  EXPECT_EQ(s.variant, Variant::flash_subgroup) << s.detail();
  EXPECT_TRUE(mentions(s, "forced flash_coopmat_nv not possible")) << s.detail();
  const KernelOverride tiles = vulkan::parse_tiles("ds=2,rpt=1,bc=16,ku=4,rows=16,split=4");
  EXPECT_EQ(tiles.ds, 2u);
  EXPECT_EQ(tiles.nsplit, 4u);
  s = vulkan::select_kernel(lavapipe(), kDebian12, prefill(DType::f32, 64, 512, 8, 8), tiles);
  EXPECT_EQ(s.subgroup.ds, 2u);
  EXPECT_EQ(s.subgroup.rpt, 1u);
  EXPECT_EQ(s.subgroup.bc, 16u);
  EXPECT_EQ(s.subgroup.ku, 4u);
  EXPECT_EQ(s.subgroup.nsplit, 4u);
  EXPECT_EQ(s.subgroup.wg, 32u);  // 16 rows x 2 lanes
  EXPECT_FALSE(s.subgroup.one_subgroup);
  EXPECT_EQ(vulkan::parse_variant("flash_subgroup"), Variant::flash_subgroup);
  EXPECT_FALSE(vulkan::parse_variant("nope").has_value());
}

// Invariants of every choice over a sweep of devices and shapes.
TEST(VulkanSelect, TilesAreConsistentEverywhere) {
  for (const DeviceDesc& dev : {lavapipe(), h100(), wave64()})
    for (const BuildCaps caps : {kNoCoopmat, kDebian12, kNewGlslc})
      for (DType t : {DType::f32, DType::f16, DType::bf16})
        for (std::int64_t D : {1, 40, 64, 80, 96, 112, 128, 192, 256, 512})
          for (std::int64_t G : {1, 2, 4, 8, 16})
            for (std::int64_t Tq : {1, 7, 300}) {
              ProblemShape p = prefill(t, D, Tq, 16, 16 / G);
              p.Tk = 1000;
              const Selection s = vulkan::select_kernel(dev, caps, p);
              SCOPED_TRACE(dev.name + " D=" + std::to_string(D) + " G=" + std::to_string(G) +
                           " Tq=" + std::to_string(Tq) + ": " + s.kernel() + " " + s.detail());
              if (s.variant == Variant::flash_subgroup) {
                const auto& k = s.subgroup;
                EXPECT_LE(k.wg, dev.max_invocations);
                EXPECT_EQ(k.wg % dev.max_subgroup_size, 0u);
                EXPECT_LE(static_cast<std::uint64_t>(k.q_rows) * k.head_rows,
                          static_cast<std::uint64_t>(k.wg) / k.ds * k.rpt);
                EXPECT_EQ(G % k.head_rows, 0);
                EXPECT_GE(4 * k.ds * k.dk4, D);
                EXPECT_GE(4 * k.ds * k.dv4, D);
                EXPECT_LE(k.bc, 32u);
                EXPECT_EQ(k.bc % k.ku, 0u);
                EXPECT_LE(k.shared_bytes, dev.shared_memory_bytes);
                EXPECT_GE(k.nsplit, 1u);
              } else if (s.variant == Variant::flash_decode) {
                const auto& k = s.decode;
                EXPECT_FALSE(dev.software);
                EXPECT_LE(Tq * G, vulkan::kDecodeMaxRowsPerKvHead);
                EXPECT_LE(k.wg, dev.max_invocations);
                EXPECT_EQ(k.wg % dev.max_subgroup_size, 0u);
                EXPECT_LE(static_cast<std::uint64_t>(k.q_rows) * k.head_rows, k.rows);
                EXPECT_EQ(G % k.head_rows, 0);
                EXPECT_GE(8 * k.ds * k.dk8, D);
                EXPECT_GE(8 * k.ds * k.dv8, D);
                EXPECT_LE(k.ds, dev.min_subgroup_size);
                EXPECT_EQ(k.wg / k.ds * k.ku, k.bc);  // every key of a tile has one team
                EXPECT_LE(k.shared_bytes, dev.shared_memory_bytes);
                EXPECT_GE(k.max_subgroups * dev.min_subgroup_size, k.wg);
                EXPECT_GE(k.nsplit, 1u);
              } else if (s.variant == Variant::flash_coopmat_khr || s.variant == Variant::flash_coopmat_nv) {
                EXPECT_EQ(t, DType::f16);
                EXPECT_LE(s.coop.shared_bytes, dev.shared_memory_bytes);
                EXPECT_GE(s.coop.dpad, D);
                EXPECT_EQ(G % s.coop.head_rows, 0);
                EXPECT_LE(static_cast<std::uint64_t>(s.coop.q_rows) * s.coop.head_rows,
                          16u * s.coop.subgroups);
              } else if (s.variant == Variant::flash_rowwise) {
                // Only where a software device would idle all but one lane of a subgroup.
                EXPECT_TRUE(dev.software);
                EXPECT_LE(Tq * G * 8, static_cast<std::int64_t>(dev.subgroup_size));
              } else {
                ADD_FAILURE() << "unexpected variant";
              }
            }
}

#if ATTNOPS_TEST_VULKAN_BUILT
// Launch plans are data: which pipelines, in which order, over how many workgroups (built only
// with the real backend: the plans name its pipelines).
TEST(VulkanLaunchPlan, StepsOfEachVariant) {
  AttentionProblem p;
  p.B = 2;
  p.Tq = 1;
  p.Tk = 4096;
  p.Hq = 16;
  p.Hkv = 2;
  p.D = p.Dv = 128;
  p.dtype = DType::f16;
  ProblemShape shape = decode(DType::f16, 4096, 16, 2);
  shape.B = 2;
  const Selection split = vulkan::select_kernel(h100(), kNewGlslc, shape, {}, kNoDecodeKernel);
  ASSERT_TRUE(split.split_kv()) << split.detail();
  vulkan::PushConstants base{};
  base.nq = 1;
  const vulkan::LaunchPlan lp = vulkan::plan_flash(p, split, base);
  ASSERT_EQ(lp.steps.size(), 2u);
  EXPECT_EQ(lp.steps[0].key.shader, vulkan::rt::ShaderId::flash_tiled);
  EXPECT_EQ(lp.steps[0].key.spec[7], 1u);  // SPLIT
  EXPECT_EQ(lp.steps[0].groups[0], split.subgroup.nsplit);
  EXPECT_EQ(lp.steps[0].groups[1], 16u / split.subgroup.head_rows);
  EXPECT_EQ(lp.steps[0].groups[2], 2u);
  EXPECT_EQ(lp.steps[0].push.nsplit, static_cast<std::int32_t>(split.subgroup.nsplit));
  EXPECT_EQ(lp.steps[1].key.shader, vulkan::rt::ShaderId::attn_merge);
  EXPECT_EQ(lp.steps[1].groups, (std::array<std::uint32_t, 3>{1, 16, 2}));
  EXPECT_EQ(lp.scratch_bytes, 2u * 16u * 1u * split.subgroup.nsplit * (128u + 2u) * 4u);

  // flash_decode: the same merge after its own first pass; 16-byte loads where the push
  // constants say the rows are whole aligned vectors (ALIGNED = 2), 4-element loads otherwise.
  const Selection dec = vulkan::select_kernel(h100(), kNewGlslc, shape);
  ASSERT_EQ(dec.kernel(), "flash_decode+split_kv") << dec.detail();
  base.flags = vulkan::kVec | vulkan::kAligned4;
  const vulkan::LaunchPlan dp = vulkan::plan_flash(p, dec, base);
  ASSERT_EQ(dp.steps.size(), 2u);
  EXPECT_EQ(dp.steps[0].key.shader, vulkan::rt::ShaderId::flash_decode);
  EXPECT_EQ(dp.steps[0].key.spec[0], dec.decode.wg);
  EXPECT_EQ(dp.steps[0].key.spec[3], dec.decode.rows);
  EXPECT_EQ(dp.steps[0].key.spec[7], 1u);   // SPLIT
  EXPECT_EQ(dp.steps[0].key.spec[10], 2u);  // ALIGNED: 16-byte loads
  EXPECT_EQ(dp.steps[0].groups[0], dec.decode.nsplit);
  EXPECT_EQ(dp.steps[0].groups[1], 16u / dec.decode.head_rows);
  EXPECT_EQ(dp.steps[1].key.shader, vulkan::rt::ShaderId::attn_merge);
  EXPECT_EQ(dp.scratch_bytes, 2u * 16u * 1u * dec.decode.nsplit * (128u + 2u) * 4u);
  base.flags = vulkan::kAligned4;
  EXPECT_EQ(vulkan::plan_flash(p, dec, base).steps[0].key.spec[10], 1u);
  base.flags = 0;
  EXPECT_EQ(vulkan::plan_flash(p, dec, base).steps[0].key.spec[10], 0u);

  p.Tq = 4096;
  const Selection coop = vulkan::select_kernel(h100(), kDebian12, prefill(DType::f16));
  base.nq = 64;
  const vulkan::LaunchPlan cp = vulkan::plan_flash(p, coop, base);
  ASSERT_EQ(cp.steps.size(), 1u);
  EXPECT_EQ(cp.steps[0].key.shader, vulkan::rt::ShaderId::flash_coopmat_nv);
  EXPECT_EQ(cp.steps[0].key.subgroup_size, 32u);
  EXPECT_TRUE(cp.steps[0].key.full_subgroups);
  EXPECT_EQ(cp.steps[0].key.spec[0], 128u);  // 4 subgroups of 32
  EXPECT_EQ(cp.scratch_bytes, 0u);

  ProblemShape v = prefill(DType::f16, 128, 4096, 16, 2);
  v.vanilla = true;
  p.Dv = 80;
  const Selection gemm = vulkan::select_kernel(h100(), kDebian12, v);
  const vulkan::LaunchPlan vp = vulkan::plan_vanilla_gemm(p, gemm, base);
  ASSERT_EQ(vp.steps.size(), 3u);
  EXPECT_EQ(vp.steps[0].key.shader, vulkan::rt::ShaderId::vanilla_scores);
  EXPECT_EQ(vp.steps[1].key.shader, vulkan::rt::ShaderId::vanilla_softmax);
  EXPECT_EQ(vp.steps[2].key.shader, vulkan::rt::ShaderId::vanilla_pv);
  EXPECT_EQ(vp.steps[2].groups[0], 64u * 3u);  // q blocks x column blocks of 32 (Dv = 80)
  EXPECT_EQ(vp.scratch_bytes, 2u * 16u * 4096u * 4096u * 4u);
}

// A cooperative-matrix extension is enabled on a device only where this build holds its shaders:
// on the H100 (driver 580) this build enabled VK_KHR_cooperative_matrix that Debian 12's glslc
// cannot compile for, and the validation layers of Debian 12 failed every device creation.
TEST(VulkanLaunchPlan, CooperativeMatrixExtensionsOnlyWhereTheBuildHoldsTheirShaders) {
  vulkan::rt::DeviceCaps both;
  both.coopmat_khr = both.coopmat_nv = true;
  const auto debian = vulkan::rt::coopmat_enables(both, kDebian12);
  EXPECT_FALSE(debian.khr);
  EXPECT_TRUE(debian.nv);
  const auto newer = vulkan::rt::coopmat_enables(both, kNewGlslc);
  EXPECT_TRUE(newer.khr);
  EXPECT_TRUE(newer.nv);
  const auto none = vulkan::rt::coopmat_enables(both, kNoCoopmat);
  EXPECT_FALSE(none.khr || none.nv);
  vulkan::rt::DeviceCaps neither;  // a device that offers neither: nothing, whatever the build holds
  const auto absent = vulkan::rt::coopmat_enables(neither, kNewGlslc);
  EXPECT_FALSE(absent.khr || absent.nv);
}
#endif

// The description read from the device this machine has (lavapipe in CI).
using VulkanDeviceDesc = VulkanTest;
TEST_F(VulkanDeviceDesc, DescribesTheSelectedDevice) {
  const DeviceDesc d = vulkan::debug::device_desc(software_ok());
  EXPECT_FALSE(d.name.empty());
  EXPECT_GT(d.subgroup_size, 0u);
  EXPECT_LE(d.min_subgroup_size, d.subgroup_size);
  EXPECT_GE(d.max_subgroup_size, d.subgroup_size);
  EXPECT_GT(d.shared_memory_bytes, 0u);
  EXPECT_GT(d.max_invocations, 0u);
  if (d.software) {  // lavapipe (Mesa 22.3): 8 lanes, 32 KiB, no cooperative matrices
    EXPECT_FALSE(d.coopmat_khr || d.coopmat_nv) << d.name;
    EXPECT_TRUE(d.coopmat_khr_shapes.empty() && d.coopmat_nv_shapes.empty());
  }
  EXPECT_EQ(vulkan::build_caps().coopmat_nv, ATTNOPS_TEST_COOPMAT_NV != 0);
}

}  // namespace
}  // namespace attnops::testing
