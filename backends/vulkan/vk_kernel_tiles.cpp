// The tile shapes of each kernel variant (vk_kernel_tiles.h). Every number here is derived from
// the device description; the rules are stated where they are applied.
#include "backends/vulkan/vk_kernel_tiles.h"

#include <algorithm>

namespace attnops::vulkan {

namespace {

std::uint32_t pow2_floor(std::uint32_t x) {
  std::uint32_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}
std::uint64_t pow2_ceil(std::uint64_t x) {
  std::uint64_t p = 1;
  while (p < x) p *= 2;
  return p;
}
bool is_pow2(std::uint32_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

// The largest divisor of n that is <= cap (>= 1).
std::uint32_t divisor_at_most(std::uint64_t n, std::uint64_t cap) {
  for (std::uint64_t d = std::min(n, cap); d > 1; --d)
    if (n % d == 0) return static_cast<std::uint32_t>(d);
  return 1;
}

// Query positions x q heads of one workgroup's `rows` rows. Heads are packed (the q heads of one
// kv head share staged K/V tiles) when the problem has fewer positions than rows and the mask is
// the same for every head; head_rows divides the GQA group so that all share one kv head.
void pack_rows(const ProblemShape& p, std::uint32_t rows, std::uint32_t& q_rows, std::uint32_t& head_rows) {
  if (p.per_head_map) {
    q_rows = rows;
    head_rows = 1;
    return;
  }
  q_rows = static_cast<std::uint32_t>(std::min<std::int64_t>(rows, std::max<std::int64_t>(p.Tq, 1)));
  head_rows = divisor_at_most(static_cast<std::uint64_t>(p.Hq / p.Hkv), rows / q_rows);
}

// Split-KV (flash-decoding) chunks per row for a grid of `base_groups` workgroups of
// `subgroups_per_group` subgroups over kv tiles of `bc` keys. When the problem has fewer
// workgroups than the device wants resident, each row's tiles are cut into chunks, each of >= 4
// tiles, merged afterwards; the partials must fit a buffer. The target is sized from the compute
// units and the subgroups a workgroup holds: about 8 subgroups per compute unit (2 workgroups of
// 4 subgroups, 8 of one: a decode's one-subgroup workgroups would otherwise leave most of each
// unit idle); 16 on a software device, 64 when the count is unknown. At most 256 chunks (the
// merge reads them all per row).
std::uint64_t split_count(const DeviceDesc& dev, const ProblemShape& p, std::uint64_t base_groups,
                          std::uint64_t subgroups_per_group, std::uint32_t bc, const KernelOverride& force) {
  const std::uint64_t groups_per_unit =
      std::max<std::uint64_t>(2, 8 / std::max<std::uint64_t>(1, subgroups_per_group));
  const std::uint64_t want =
      dev.compute_units ? groups_per_unit * dev.compute_units : (dev.software ? 16u : 64u);
  const std::uint64_t tiles = ceil_div(static_cast<std::uint64_t>(p.Tk), bc);
  std::uint64_t nsplit = 1;
  if (base_groups < want && tiles >= 8)
    nsplit = std::min<std::uint64_t>({ceil_div(want, base_groups), tiles / 4, kMaxSplits});
  if (force.nsplit != 0) nsplit = std::min<std::uint64_t>(force.nsplit, std::max<std::uint64_t>(tiles, 1));
  const std::uint64_t row_bytes =
      static_cast<std::uint64_t>(p.B * p.Hq * p.Tq) * static_cast<std::uint64_t>(p.Dv + 2) * 4u;
  while (nsplit > 1 && row_bytes * nsplit > p.buffer_range) nsplit /= 2;
  return nsplit;
}

// The 16x16x16 f16 x f16 -> f32 subgroup shape the coopmat shader uses, if listed.
bool has_f16_16x16x16(const std::vector<CoopMatShape>& shapes) {
  return std::any_of(shapes.begin(), shapes.end(), [](const CoopMatShape& s) {
    return s.M == 16 && s.N == 16 && s.K == 16 && s.a == MatType::f16 && s.b == MatType::f16 &&
           s.c == MatType::f32 && s.result == MatType::f32;
  });
}

// Shared memory of flash_coopmat.comp (must match the shader's declarations, strides padded by
// 16 bytes).
std::uint64_t coop_shared_bytes(std::uint32_t subgroups, std::uint32_t bc, std::uint32_t dpad,
                                std::uint32_t dvpad) {
  const std::uint64_t kstr = dpad + 8u, vstr = dvpad + 8u, sstr = bc + 4u, pstr = bc + 8u, ostr = 20u;
  const std::uint64_t rows = 16u * subgroups;
  const std::uint64_t kv =
      std::max<std::uint64_t>(bc * (kstr + vstr), rows * kstr) * 2u;  // f16 K, V (Q before)
  return kv + rows * sstr * 4u                                        // S (f32)
         + rows * pstr * 2u                                           // P (f16)
         + rows * ostr * 4u  // one 16x16 block of P V per subgroup (f32)
         + rows * 3u * 4u    // alpha, l, m per row
         + 2u * 4u;          // the non-finite-V flags
}

}  // namespace

std::uint32_t min_subgroup(const DeviceDesc& dev) {
  return std::max<std::uint32_t>(1, dev.min_subgroup_size ? dev.min_subgroup_size : dev.subgroup_size);
}
std::uint32_t max_subgroup(const DeviceDesc& dev) {
  return std::max<std::uint32_t>(1, dev.max_subgroup_size ? dev.max_subgroup_size : dev.subgroup_size);
}

// flash_subgroup's tiles, or nullopt with *why.
//
// Two regimes. On a GPU the head dimension is split over the lanes of a team (subgroup shuffles
// sum the dot products), the workgroup holds 64 rows (32 on narrow subgroups) and steps of 8
// keys. On a CPU implementation (a software device such as lavapipe) every memory instruction is
// emulated lane by lane and the workgroup runs as a coroutine, so there the workgroup is one
// subgroup (no workgroup barrier), a lane owns whole rows (no shuffles) and up to 4 or 8 of them
// (each staged K/V read serves them all), and a step is one key (a small shader: LLVM's compile
// time grows steeply with its size).
std::optional<SubgroupTiles> subgroup_tiles(const DeviceDesc& dev, const ProblemShape& p,
                                            const KernelOverride& force, std::string* why) {
  if (p.D > kMaxHeadDim || p.Dv > kMaxHeadDim) {
    *why = "head dims up to " + std::to_string(kMaxHeadDim);
    return std::nullopt;
  }
  const std::uint32_t sg = std::max<std::uint32_t>(1, dev.subgroup_size), sg_min = min_subgroup(dev);
  const std::uint32_t dmax = static_cast<std::uint32_t>(std::max(p.D, p.Dv));
  const bool fixed_size = sg_min == max_subgroup(dev) && sg == sg_min;  // every subgroup has sg lanes
  const bool cpu = dev.software && fixed_size;
  const auto lane_vec4 = [&](std::uint32_t ds) {
    return ceil_div(static_cast<std::uint64_t>(p.D), 4u * ds) +
           ceil_div(static_cast<std::uint64_t>(p.Dv), 4u * ds);
  };
  const std::uint64_t group = static_cast<std::uint64_t>(p.Hq / p.Hkv);
  const std::uint64_t available = static_cast<std::uint64_t>(p.Tq) * (p.per_head_map ? 1 : group);
  // On a CPU implementation a lane owns whole rows, so a problem with one row per kv head in 8+
  // lanes (a decode without GQA) leaves the other lanes idle; there the row-wise kernel wins
  // (lavapipe, B1 H16 Tq1 Tk4096 D128: 100 ms row-wise against 243-291 ms here, 1 of 8 lanes busy;
  // with GQA 8 the lanes fill and this kernel with split-KV takes 32 ms against 255 ms row-wise).
  if (cpu && !force.variant && available * 8 <= sg) {
    *why = "software device with " + std::to_string(available) + " row(s) per kv head for " +
           std::to_string(sg) + " lanes (a lane per row would idle the rest)";
    return std::nullopt;
  }
  SubgroupTiles t;

  // Lanes per row: on a GPU keep >= 8 rows per subgroup, and more lanes while a lane would hold
  // over 32 vec4 of q and o (register pressure), but never more lanes than the row has vec4s,
  // and none without subgroup shuffles. A team of several lanes is numbered by subgroup lane
  // (flash_tiled.comp), which needs every subgroup full: full subgroups required, or a fixed
  // subgroup size (the workgroup is a whole number of subgroups).
  const bool teams_ok = dev.full_subgroups || fixed_size;
  const std::uint32_t ds_max = dev.subgroup_shuffle && teams_ok ? std::min<std::uint32_t>(sg_min, 16) : 1;
  t.ds = 1;
  if (!cpu) {
    t.ds = std::min(ds_max, pow2_floor(std::max<std::uint32_t>(1, sg_min / 8)));
    while (t.ds < ds_max && lane_vec4(t.ds) > 32) t.ds *= 2;
    while (t.ds > 1 && (t.ds / 2) * 4 >= dmax) t.ds /= 2;
  }
  if (force.ds != 0) {
    if (!is_pow2(force.ds) || force.ds > ds_max) {
      *why = "forced ds=" + std::to_string(force.ds) + " is not a power of two <= " + std::to_string(ds_max);
      return std::nullopt;
    }
    t.ds = force.ds;
  }
  t.dk4 = static_cast<std::uint32_t>(ceil_div(static_cast<std::uint64_t>(p.D), 4u * t.ds));
  t.dv4 = static_cast<std::uint32_t>(ceil_div(static_cast<std::uint64_t>(p.Dv), 4u * t.ds));

  // Rows per team: on a GPU 2 when the registers allow (each staged K/V vec4 read serves two
  // rows); on a CPU up to 4 within 128 vec4 of q and o per lane, and on prefill-sized problems
  // (>= 512 rows) up to 8 within 256 vec4 (a bigger shader: on lavapipe it compiles once in ~10 s
  // and runs ~1.3x faster), no more than the problem fills.
  if (cpu) {
    const bool large = available >= 512;
    const std::uint64_t state = large ? 256 : 128;
    t.rpt = std::min<std::uint32_t>(
        large ? 8 : 4,
        pow2_floor(static_cast<std::uint32_t>(std::max<std::uint64_t>(1, state / lane_vec4(1)))));
    t.rpt = std::min<std::uint32_t>(
        t.rpt, static_cast<std::uint32_t>(std::max<std::uint64_t>(1, pow2_ceil(available) / sg)));
  } else {
    t.rpt = (sg >= 16 && t.dk4 + t.dv4 <= 16) ? 2 : 1;
  }
  if (force.rpt != 0) t.rpt = std::min<std::uint32_t>(force.rpt, 8);

  // Rows per workgroup: on a CPU one subgroup of teams; on a GPU 64 (32 on narrow subgroups),
  // fewer when the problem has fewer (decode: the q heads of one kv head x Tq), but at least one
  // full subgroup of teams; the workgroup is a whole number of the widest subgroups.
  const std::uint64_t min_rows = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(sg) * t.rpt / t.ds);
  std::uint64_t rows = min_rows;
  if (!cpu) rows = std::max(min_rows, std::min<std::uint64_t>(sg >= 32 ? 64 : 32, pow2_ceil(available)));
  if (force.rows != 0) rows = std::max<std::uint64_t>(t.rpt, force.rows / t.rpt * t.rpt);
  while ((rows / t.rpt * t.ds) % max_subgroup(dev) != 0 && rows < 4096) rows *= 2;
  t.wg = static_cast<std::uint32_t>(rows / t.rpt * t.ds);
  t.one_subgroup = t.wg == sg && fixed_size;
  if (t.wg > dev.max_invocations || t.wg > dev.max_group_size_x) {
    *why = std::to_string(t.wg) + " invocations per workgroup exceed the device's limit";
    return std::nullopt;
  }
  pack_rows(p, static_cast<std::uint32_t>(rows), t.q_rows, t.head_rows);

  // Keys per tile: the largest power of two <= 32 (one visibility word per row) whose K and V
  // tiles (f32) fit the shared-memory budget: all of it on a software device, half of it on a
  // GPU so that two workgroups can be resident per multiprocessor.
  const std::uint64_t budget = dev.software ? dev.shared_memory_bytes : dev.shared_memory_bytes / 2;
  const std::uint64_t per_key = static_cast<std::uint64_t>(t.dk4 + t.dv4) * t.ds * 16u;
  t.bc = 32;
  while (t.bc > 4 && t.bc * per_key > budget) t.bc /= 2;
  if (force.bc != 0) {
    if (!is_pow2(force.bc) || force.bc > 32 || force.bc * per_key > dev.shared_memory_bytes) {
      *why = "forced bc=" + std::to_string(force.bc) + " is not a power of two <= 32 that fits shared memory";
      return std::nullopt;
    }
    t.bc = force.bc;
  }
  t.shared_bytes = static_cast<std::uint32_t>(t.bc * per_key);
  if (t.shared_bytes > budget && force.bc == 0) {
    *why = "D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) + " need " +
           std::to_string(4 * per_key) + " bytes of shared memory for 4 keys, over the budget of " +
           std::to_string(budget);
    return std::nullopt;
  }
  // Keys per online-softmax step: 8 on a GPU (a small unrolled body; the rescale costs one
  // multiply per accumulator element per 8 keys), 1 on a CPU.
  t.ku = cpu ? 1 : std::min<std::uint32_t>(t.bc, 8);
  if (force.ku != 0 && is_pow2(force.ku) && force.ku <= t.bc) t.ku = force.ku;

  const std::uint64_t base_groups = ceil_div(static_cast<std::uint64_t>(p.Tq), t.q_rows) *
                                    static_cast<std::uint64_t>(p.Hq / t.head_rows) *
                                    static_cast<std::uint64_t>(p.B);
  const std::uint64_t nsplit =
      split_count(dev, p, base_groups, std::max<std::uint32_t>(1, t.wg / sg), t.bc, force);
  t.nsplit = static_cast<std::uint32_t>(nsplit);
  return t;
}

// flash_decode's tiles, or nullopt with *why.
//
// A team of ds lanes per key: ds the smallest power of two with 8 * ds >= max(D, Dv) (a lane's
// chunk is 8 elements, one 16-byte load of 16-bit data), at most the narrowest subgroup and 32.
// The workgroup: 128 invocations (4 subgroups of 32, 2 of 64) or 4 subgroups when they are
// narrower (lavapipe's 8 lanes: 32), a whole number of the widest subgroups, at most one team
// per key of a 32-key tile. Rows per workgroup: up to 4 within 64 floats of q and o per lane
// (a row takes 16 at D <= 8 x ds; with a team's 4 keys of K, their scores and the row
// statistics, 8 rows would approach an NVIDIA thread's 255 registers and spill), no more than
// the problem has per kv head. The shared memory holds one combined state per subgroup and row.
std::optional<DecodeTiles> decode_tiles(const DeviceDesc& dev, const ProblemShape& p,
                                        const KernelOverride& force, std::string* why) {
  if (p.D > kMaxHeadDim || p.Dv > kMaxHeadDim) {
    *why = "head dims up to " + std::to_string(kMaxHeadDim);
    return std::nullopt;
  }
  const std::uint32_t sg = std::max<std::uint32_t>(1, dev.subgroup_size), sg_min = min_subgroup(dev),
                      sg_max = max_subgroup(dev);
  const bool fixed_size = sg_min == sg_max && sg == sg_min;
  if (!dev.subgroup_shuffle || !(dev.full_subgroups || fixed_size)) {
    *why =
        "needs subgroup shuffles and full subgroups or a single subgroup size (its teams are numbered by "
        "subgroup lane)";
    return std::nullopt;
  }
  DecodeTiles t;
  const std::uint32_t ds_max = std::min<std::uint32_t>(sg_min, 32);
  const std::uint64_t dmax = static_cast<std::uint64_t>(std::max(p.D, p.Dv));
  t.ds = static_cast<std::uint32_t>(std::min<std::uint64_t>(ds_max, pow2_ceil(ceil_div(dmax, 8))));
  if (force.ds != 0) {
    if (!is_pow2(force.ds) || force.ds > ds_max) {
      *why = "forced ds=" + std::to_string(force.ds) + " is not a power of two <= " + std::to_string(ds_max);
      return std::nullopt;
    }
    t.ds = force.ds;
  }
  // On a software device (where it runs only when forced: tests, the self-check) 8-key tiles
  // and at most 2 rows: LLVM's compile time there grows steeply with the unrolled rows x
  // keys-per-team body (lavapipe: 8 rows x 8 keys took ~9 s per pipeline).
  t.bc = dev.software ? 8 : 32;
  if (force.bc != 0) {
    if (!is_pow2(force.bc) || force.bc > 32) {
      *why = "forced bc=" + std::to_string(force.bc) + " is not a power of two <= 32";
      return std::nullopt;
    }
    t.bc = force.bc;
  }
  std::uint64_t wg = std::max<std::uint32_t>(std::min<std::uint32_t>(128, 4 * sg_max), sg_max);
  while (wg / t.ds > t.bc && wg > sg_max) wg /= 2;
  while (wg / t.ds > t.bc && t.ds < ds_max) t.ds *= 2;
  if (wg / t.ds > t.bc || wg > dev.max_invocations || wg > dev.max_group_size_x) {
    *why = "no workgroup of whole subgroups (" + std::to_string(sg_max) + " lanes) fits " +
           std::to_string(t.bc) + " teams within the device's limits";
    return std::nullopt;
  }
  t.wg = static_cast<std::uint32_t>(wg);
  t.ku = t.bc / (t.wg / t.ds);
  t.dk8 = static_cast<std::uint32_t>(ceil_div(static_cast<std::uint64_t>(p.D), 8u * t.ds));
  t.dv8 = static_cast<std::uint32_t>(ceil_div(static_cast<std::uint64_t>(p.Dv), 8u * t.ds));
  const std::uint64_t state =
      static_cast<std::uint64_t>(t.dk8 + t.dv8) * 8u;  // floats of q and o per lane and row
  if (state > 128) {
    *why = "D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) + " need " + std::to_string(state) +
           " floats of q and o per lane and row with " + std::to_string(t.ds) +
           " lanes per key (at most 128)";
    return std::nullopt;
  }
  const std::uint64_t group = static_cast<std::uint64_t>(p.Hq / p.Hkv);
  const std::uint64_t available = static_cast<std::uint64_t>(p.Tq) * (p.per_head_map ? 1 : group);
  std::uint64_t rows = std::min<std::uint64_t>(
      {dev.software ? 2u : 4u, pow2_floor(static_cast<std::uint32_t>(64 / state)), pow2_ceil(available)});
  if (force.rows != 0) rows = std::min<std::uint64_t>(pow2_floor(force.rows), 16);
  t.max_subgroups = t.wg / sg_min;
  const auto shared_for = [&](std::uint64_t r) {
    return static_cast<std::uint64_t>(t.max_subgroups) * r * (8u * t.ds * t.dv8 + 3u) * 4u;
  };
  while (rows > 1 && shared_for(rows) > dev.shared_memory_bytes) rows /= 2;
  t.rows = static_cast<std::uint32_t>(rows);
  pack_rows(p, t.rows, t.q_rows, t.head_rows);
  const std::uint64_t shared = shared_for(rows);
  if (shared > dev.shared_memory_bytes) {
    *why = "its combination needs " + std::to_string(shared) + " bytes of shared memory, over " +
           std::to_string(dev.shared_memory_bytes);
    return std::nullopt;
  }
  t.shared_bytes = static_cast<std::uint32_t>(shared);
  const std::uint64_t base_groups = ceil_div(static_cast<std::uint64_t>(p.Tq), t.q_rows) *
                                    static_cast<std::uint64_t>(p.Hq / t.head_rows) *
                                    static_cast<std::uint64_t>(p.B);
  t.nsplit = static_cast<std::uint32_t>(split_count(dev, p, base_groups, t.wg / sg, t.bc, force));
  return t;
}

// flash_coopmat's tiles, or nullopt with *why. `shapes`: the extension's listed shapes.
std::optional<CoopTiles> coop_tiles(const DeviceDesc& dev, const std::vector<CoopMatShape>& shapes,
                                    const ProblemShape& p, std::string* why) {
  if (p.dtype == DType::f32) {
    *why = "f32 inputs (the cooperative-matrix kernel multiplies f16)";
    return std::nullopt;
  }
  if (p.dtype != DType::f16) {
    *why = "bf16 inputs (bf16 cooperative matrices need GL_EXT_bfloat16, which this build's glslc lacks)";
    return std::nullopt;
  }
  if (!has_f16_16x16x16(shapes)) {
    *why = "the device lists no 16x16x16 f16 x f16 -> f32 subgroup shape";
    return std::nullopt;
  }
  if (!dev.shader_f16 || !dev.vulkan_memory_model || !dev.subgroup_shuffle) {
    *why = "shaderFloat16, vulkanMemoryModel and subgroup shuffles are required";
    return std::nullopt;
  }
  const std::uint32_t sg = dev.subgroup_size;
  // The kernel maps lanes to matrix rows by the specialization constant SG: every subgroup must
  // have exactly SG lanes (a required size, or a device with one size) and be full.
  const bool size_guaranteed =
      dev.subgroup_size_control || (dev.min_subgroup_size == sg && dev.max_subgroup_size == sg);
  if (!size_guaranteed || !dev.full_subgroups) {
    *why =
        "the subgroup size is not guaranteed (needs subgroup size control or a single size, and full "
        "subgroups)";
    return std::nullopt;
  }
  if (sg < 16 || sg > 128 || !is_pow2(sg)) {
    *why = "subgroup size " + std::to_string(sg) +
           " (16 to 128 lanes needed: a row's softmax takes sg/16 lanes)";
    return std::nullopt;
  }
  if (p.D > 256 || p.Dv > 256) {
    *why = "head dims up to 256";
    return std::nullopt;
  }
  const std::uint64_t group = static_cast<std::uint64_t>(p.Hq / p.Hkv);
  const std::uint64_t available = static_cast<std::uint64_t>(p.Tq) * (p.per_head_map ? 1 : group);
  if (available < 16) {
    *why = "fewer than 16 query rows per kv head (decode-sized; 16-row matrix tiles would idle)";
    return std::nullopt;
  }
  CoopTiles t;
  t.subgroup = sg;
  t.dpad = static_cast<std::uint32_t>((p.D + 15) / 16 * 16);
  t.dvpad = static_cast<std::uint32_t>((p.Dv + 15) / 16 * 16);
  // The most subgroups (rows) with 32-key tiles, then 16-key tiles, that fit shared memory; no
  // more rows than the problem has.
  for (std::uint32_t nsg : {4u, 2u, 1u}) {
    if (nsg > 1 && 16u * nsg / 2 >= pow2_ceil(available)) continue;
    if (nsg * sg > dev.max_invocations || nsg * sg > dev.max_group_size_x) continue;
    for (std::uint32_t bc : {32u, 16u}) {
      const std::uint64_t bytes = coop_shared_bytes(nsg, bc, t.dpad, t.dvpad);
      if (bytes <= dev.shared_memory_bytes) {
        t.subgroups = nsg;
        t.bc = bc;
        t.shared_bytes = static_cast<std::uint32_t>(bytes);
        pack_rows(p, 16u * nsg, t.q_rows, t.head_rows);
        return t;
      }
    }
  }
  *why = "D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) + " need " +
         std::to_string(coop_shared_bytes(1, 16, t.dpad, t.dvpad)) + " bytes of shared memory, over " +
         std::to_string(dev.shared_memory_bytes);
  return std::nullopt;
}

}  // namespace attnops::vulkan
