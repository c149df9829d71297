// flash_decode's selection on injected device descriptions: when it is taken,
// its tiles on an H100, a wave64 device and lavapipe (forced), and why it is passed over.
#include <gtest/gtest.h>

#include <string>

#include "backends/vulkan/vk_kernel_select.h"
#include "tests/support/testing.h"
#include "tests/vulkan/injected_devices.h"
#include "tests/vulkan/select_shapes.h"

namespace attnops::testing {
namespace {

using vulkan::DeviceDesc;
using vulkan::KernelOverride;

// The decode shape: a workgroup splits the keys over teams of lanes (8 elements
// per lane and chunk: one 16-byte load of 16-bit data), its rows the q heads of one kv head.
TEST(VulkanSelect, DecodeShapedProblemsTakeTheDecodeKernelOnAGpu) {
  // B1 H16 Tk32768 D128 f16 on the H100: 16 lanes per key, 4 subgroups = 8 teams of 4 keys per
  // 32-key tile, one row per workgroup, 17 chunks per row (16 x 17 = 272 workgroups >= 2 x 132).
  const Selection d = vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f16, 32768, 16, 16));
  ASSERT_EQ(d.variant, Variant::flash_decode) << d.detail();
  EXPECT_EQ(d.decode.ds, 16u);
  EXPECT_EQ(d.decode.dk8, 1u);
  EXPECT_EQ(d.decode.wg, 128u);
  EXPECT_EQ(d.decode.ku, 4u);
  EXPECT_EQ(d.decode.rows, 1u);
  EXPECT_EQ(d.decode.nsplit, 17u);
  EXPECT_EQ(d.decode.max_subgroups, 4u);
  EXPECT_TRUE(d.full_subgroups);
  EXPECT_TRUE(mentions(d, "lanes/key=16 teams=8 keys/team=4")) << d.detail();
  // GQA 8: 4 q heads of a kv head per workgroup (each key read once for the 4; 4 rows keep q and
  // o within 64 floats per lane), two workgroups per kv head.
  const Selection g = vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f32, 32768, 32, 4));
  ASSERT_EQ(g.variant, Variant::flash_decode) << g.detail();
  EXPECT_EQ(g.decode.head_rows, 4u);
  EXPECT_EQ(g.decode.rows, 4u);
  // GQA 2 at Tq 2: both heads and both positions in one workgroup.
  ProblemShape tq2 = decode(DType::f16, 32768, 32, 16);
  tq2.Tq = 2;
  const Selection g2 = vulkan::select_kernel(h100(), kNewGlslc, tq2);
  ASSERT_EQ(g2.variant, Variant::flash_decode) << g2.detail();
  EXPECT_EQ(g2.decode.q_rows, 2u);
  EXPECT_EQ(g2.decode.head_rows, 2u);
  // D 256: a lane per 8 elements over the whole subgroup; D 64: 8 lanes, 16 teams of 2 keys.
  const Selection d256 = vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f16, 8192, 16, 16, 256));
  EXPECT_EQ(d256.decode.ds, 32u) << d256.detail();
  EXPECT_EQ(d256.decode.ku, 8u) << d256.detail();
  const Selection d64 = vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f16, 8192, 16, 16, 64));
  EXPECT_EQ(d64.decode.ds, 8u) << d64.detail();
  EXPECT_EQ(d64.decode.ku, 2u) << d64.detail();
  // A wave64 device: 128 invocations are 2 subgroups of 64 (or 4 of 32: shared arrays for 4).
  const Selection w = vulkan::select_kernel(wave64(), kNewGlslc, decode(DType::f16, 32768, 16, 16));
  ASSERT_EQ(w.variant, Variant::flash_decode) << w.detail();
  EXPECT_EQ(w.decode.wg, 128u);
  EXPECT_EQ(w.decode.max_subgroups, 4u);
  // Prefill and wide GQA groups keep the row-tiled kernels, saying why.
  const Selection pre = vulkan::select_kernel(h100(), kNoCoopmat, prefill(DType::f32));
  EXPECT_EQ(pre.variant, Variant::flash_subgroup) << pre.detail();
  EXPECT_TRUE(mentions(pre, "flash_decode: 4096 query rows per kv head")) << pre.detail();
  EXPECT_EQ(vulkan::select_kernel(h100(), kNewGlslc, decode(DType::f16, 32768, 32, 1)).variant,
            Variant::flash_subgroup);  // 32 rows per kv head
  // Lavapipe keeps flash_subgroup's lane-per-row regime unless forced; forced, 4 subgroups of 8
  // over 8-key tiles (2 keys per team: a small shader, which LLVM compiles fast), 2 rows.
  const Selection lp = vulkan::select_kernel(lavapipe(), kDebian12, decode(DType::f32, 4096, 8, 1, 64));
  EXPECT_EQ(lp.variant, Variant::flash_subgroup) << lp.detail();
  EXPECT_TRUE(mentions(lp, "flash_decode: software device")) << lp.detail();
  KernelOverride force;
  force.variant = Variant::flash_decode;
  const Selection lpf =
      vulkan::select_kernel(lavapipe(), kDebian12, decode(DType::f32, 4096, 8, 1, 64), force);
  ASSERT_EQ(lpf.variant, Variant::flash_decode) << lpf.detail();
  EXPECT_EQ(lpf.decode.wg, 32u);
  EXPECT_EQ(lpf.decode.ds, 8u);
  EXPECT_EQ(lpf.decode.bc, 8u);
  EXPECT_EQ(lpf.decode.ku, 2u);
  EXPECT_EQ(lpf.decode.rows, 2u);
  // Forced tiles: fewer lanes per key (more chunks each), smaller tiles, rows.
  force = vulkan::parse_tiles("ds=2,bc=8,rows=2,split=3", force);
  const Selection t = vulkan::select_kernel(lavapipe(), kDebian12, decode(DType::f32, 4096, 8, 1, 64), force);
  ASSERT_EQ(t.variant, Variant::flash_decode) << t.detail();
  EXPECT_EQ(t.decode.ds, 2u);
  EXPECT_EQ(t.decode.dk8, 4u);
  EXPECT_EQ(t.decode.bc, 8u);
  EXPECT_EQ(t.decode.rows, 2u);
  EXPECT_EQ(t.decode.nsplit, 3u);
  // Without subgroup shuffles (teams sum their dot products with them) it is not taken.
  DeviceDesc no_shuffle = h100();
  no_shuffle.subgroup_shuffle = false;
  const Selection ns = vulkan::select_kernel(no_shuffle, kNoCoopmat, decode(DType::f16, 32768, 16, 16));
  EXPECT_NE(ns.variant, Variant::flash_decode) << ns.detail();
  EXPECT_TRUE(mentions(ns, "flash_decode: needs subgroup shuffles")) << ns.detail();
  // Shared memory for fewer rows: a device with 4 KiB holds 1 row of the combination.
  DeviceDesc small = h100();
  small.shared_memory_bytes = 4096;
  const Selection sm = vulkan::select_kernel(small, kNoCoopmat, decode(DType::f32, 4096, 32, 4));
  ASSERT_EQ(sm.variant, Variant::flash_decode) << sm.detail();
  EXPECT_EQ(sm.decode.rows, 1u);
  EXPECT_LE(sm.decode.shared_bytes, 4096u);
}

}  // namespace
}  // namespace attnops::testing
