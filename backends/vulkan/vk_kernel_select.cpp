// The kernel variant and tile selection (vk_kernel_select.h). Every number here is derived from
// the device description; the rules are stated where they are applied.
#include "backends/vulkan/vk_kernel_select.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "backends/vulkan/vk_kernel_tiles.h"

namespace attnops::vulkan {

BuildCaps build_caps() {
  BuildCaps caps;
#if ATTNOPS_HAVE_COOPMAT_NV
  caps.coopmat_nv = true;
#endif
#if ATTNOPS_HAVE_COOPMAT_KHR
  caps.coopmat_khr = true;
#endif
  return caps;
}

namespace {

constexpr Variant kVariants[] = {Variant::flash_coopmat_khr, Variant::flash_coopmat_nv,
                                 Variant::flash_decode,      Variant::flash_subgroup,
                                 Variant::flash_rowwise,     Variant::vanilla_gemm};

}  // namespace

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::flash_coopmat_khr:
      return "flash_coopmat_khr";
    case Variant::flash_coopmat_nv:
      return "flash_coopmat_nv";
    case Variant::flash_decode:
      return "flash_decode";
    case Variant::flash_subgroup:
      return "flash_subgroup";
    case Variant::flash_rowwise:
      return "flash_rowwise";
    case Variant::vanilla_gemm:
      return "vanilla_gemm";
  }
  return "?";
}

std::optional<Variant> parse_variant(const std::string& name) {
  for (Variant v : kVariants)
    if (name == variant_name(v)) return v;
  return std::nullopt;
}

std::vector<std::string> variant_support(const DeviceDesc& dev, const BuildCaps& caps) {
  ProblemShape canonical;
  canonical.dtype = DType::f16;
  canonical.B = 1;
  canonical.Tq = canonical.Tk = 4096;
  canonical.Hq = canonical.Hkv = 16;
  canonical.D = canonical.Dv = 128;
  std::vector<std::string> out;
  for (Variant v : kVariants) {
    std::string line = std::string(variant_name(v)) + ": ";
    const bool built = v == Variant::flash_coopmat_khr  ? caps.coopmat_khr
                       : v == Variant::flash_coopmat_nv ? caps.coopmat_nv
                                                        : true;
    if (!built) {
      line += std::string("not in this build (its glslc lacks ") +
              (v == Variant::flash_coopmat_khr ? "GL_KHR_cooperative_matrix" : "GL_NV_cooperative_matrix") +
              "; glslang 13+ for KHR)";
      out.push_back(line);
      continue;
    }
    ProblemShape p = canonical;
    p.vanilla = v == Variant::vanilla_gemm;
    p.scores_fit = true;
    KernelOverride force;
    force.variant = v;
    const Selection s = select_kernel(dev, caps, p, force);
    line += "built; this device: ";
    if (s.variant == v) {
      line += "yes";
    } else {
      std::string why = "no";
      for (const std::string& r : s.not_taken)  // the first: the forced attempt's own reason
        if (r.rfind(std::string(variant_name(v)) + ": ", 0) == 0) {
          why = "no (" + r.substr(r.find(": ") + 2) + ")";
          break;
        }
      line += why;
    }
    out.push_back(line);
  }
  return out;
}

KernelOverride parse_tiles(const std::string& text, KernelOverride base) {
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = item.substr(0, eq);
    const std::uint32_t value = static_cast<std::uint32_t>(std::strtoul(item.c_str() + eq + 1, nullptr, 10));
    if (key == "ds") base.ds = value;
    if (key == "rpt") base.rpt = value;
    if (key == "bc") base.bc = value;
    if (key == "ku") base.ku = value;
    if (key == "rows") base.rows = value;
    if (key == "split") base.nsplit = value;
  }
  return base;
}

std::string Selection::kernel() const {
  return std::string(variant_name(variant)) + (split_kv() ? "+split_kv" : "");
}

std::string Selection::detail() const {
  std::ostringstream os;
  switch (variant) {
    case Variant::flash_subgroup: {
      const SubgroupTiles& t = subgroup;
      os << "wg=" << t.wg << " lanes/row=" << t.ds << " rows/team=" << t.rpt << " rows=" << t.q_rows << "x"
         << t.head_rows << " heads, kv tile=" << t.bc << " step=" << t.ku
         << (t.one_subgroup ? " one subgroup" : "") << " shared=" << t.shared_bytes << "B";
      if (t.nsplit > 1) os << ", split-KV x" << t.nsplit << " + merge";
      break;
    }
    case Variant::flash_decode: {
      const DecodeTiles& t = decode;
      os << "wg=" << t.wg << " lanes/key=" << t.ds << " teams=" << t.wg / t.ds << " keys/team=" << t.ku
         << " rows=" << t.q_rows << "x" << t.head_rows << " heads (of " << t.rows << "), kv tile=" << t.bc
         << " shared=" << t.shared_bytes << "B";
      if (t.nsplit > 1) os << ", split-KV x" << t.nsplit << " + merge";
      break;
    }
    case Variant::flash_coopmat_khr:
    case Variant::flash_coopmat_nv:
      os << "16x16x16 f16->f32, " << coop.subgroups << " subgroups of " << coop.subgroup
         << ", rows=" << coop.q_rows << "x" << coop.head_rows << " heads, kv tile=" << coop.bc
         << " shared=" << coop.shared_bytes << "B";
      break;
    case Variant::flash_rowwise:
      os << "one invocation per row, 32x32 tiles";
      break;
    case Variant::vanilla_gemm:
      os << "scores " << gemm.tm << "x" << gemm.tn << " GEMM tiles, row softmax, P V GEMM";
      break;
  }
  if (required_size) os << ", subgroup size required";
  if (!selfcheck.empty()) os << ", self-check " << selfcheck;
  for (const std::string& r : not_taken) os << "; " << r;
  return os.str();
}

Selection select_kernel(const DeviceDesc& dev, const BuildCaps& caps, const ProblemShape& p,
                        const KernelOverride& force, const std::vector<DisabledVariant>& disabled) {
  Selection s;
  const auto pass = [&](Variant v, const std::string& why) {
    s.not_taken.push_back(std::string(variant_name(v)) + ": " + why);
  };
  const auto disabled_why = [&](Variant v) -> const std::string* {
    for (const DisabledVariant& d : disabled)
      if (d.variant == v) return &d.why;
    return nullptr;
  };
  const bool forced = force.variant.has_value();
  if (forced) s.not_taken.push_back(std::string("forced ") + variant_name(*force.variant));

  // Vanilla keeps its own GEMM path when the weights are asked for (only it writes them), or
  // when it is forced and its scores fit; otherwise it computes the same function with the flash
  // kernels, which never materialise the scores [B, Hq, Tq, Tk] f32 (review 2.8: 1 GiB and three
  // passes over it for H16 T4096; on lavapipe the flash kernels ran vanilla prefill 7-9x faster,
  // B1 H8 T256-1024 D64).
  const bool decode = p.Tq <= kDecodeMaxTq;
  if (p.vanilla && (p.want_weights || !forced || *force.variant == Variant::vanilla_gemm)) {
    if (const std::string* why = disabled_why(Variant::vanilla_gemm)) {
      pass(Variant::vanilla_gemm, *why);
      if (p.want_weights) {  // only vanilla_gemm computes the weights
        s.variant = Variant::vanilla_gemm;
        s.exhausted = true;
        return s;
      }
    } else if (p.want_weights || (forced && p.scores_fit)) {
      s.variant = Variant::vanilla_gemm;
      return s;
    } else {
      pass(Variant::vanilla_gemm,
           !p.scores_fit ? "the scores [B, Hq, Tq, Tk] f32 exceed the buffer range (no weights asked)"
           : decode ? "decode-shaped (Tq=" + std::to_string(p.Tq) + " <= " + std::to_string(kDecodeMaxTq) +
                          ", no weights asked): split-KV flash instead"
                    : std::string("no weights asked: the flash kernels compute the same function without "
                                  "materialising the scores"));
    }
  }

  const auto wants = [&](Variant v) { return !forced || *force.variant == v; };
  // Cooperative matrices, KHR first (the portable extension), then NV.
  const struct {
    Variant v;
    bool built, on_device;
    const std::vector<CoopMatShape>* shapes;
    const char *glsl, *ext;
  } coop[] = {
      {Variant::flash_coopmat_khr, caps.coopmat_khr, dev.coopmat_khr, &dev.coopmat_khr_shapes,
       "GL_KHR_cooperative_matrix (glslang 13+)", "VK_KHR_cooperative_matrix"},
      {Variant::flash_coopmat_nv, caps.coopmat_nv, dev.coopmat_nv, &dev.coopmat_nv_shapes,
       "GL_NV_cooperative_matrix", "VK_NV_cooperative_matrix"},
  };
  for (const auto& c : coop) {
    if (!wants(c.v)) continue;
    if (const std::string* why = disabled_why(c.v)) {
      pass(c.v, *why);
      continue;
    }
    if (!c.built) {
      pass(c.v, std::string("not compiled in (this build's glslc lacks ") + c.glsl + ")");
      continue;
    }
    if (!c.on_device) {
      pass(c.v, std::string("the device does not offer ") + c.ext);
      continue;
    }
    std::string why;
    if (auto t = coop_tiles(dev, *c.shapes, p, &why)) {
      // This kernel walks a row's keys in one workgroup (no split-KV): a short query over a long
      // context (B1 Hq8 Hkv1 Tq2 Tk32768: one workgroup) would leave the device idle. Where its
      // grid is under the split rule's target (2 x compute units, as flash_subgroup's) and the
      // keys span >= 8 of its tiles, flash_subgroup with split-KV runs instead (ggml splits
      // every FA path by the same rule).
      const std::uint64_t groups = ceil_div(static_cast<std::uint64_t>(p.Tq), t->q_rows) *
                                   static_cast<std::uint64_t>(p.Hq / t->head_rows) *
                                   static_cast<std::uint64_t>(p.B);
      const std::uint64_t target = dev.compute_units ? 2u * dev.compute_units : (dev.software ? 16u : 64u);
      if (!forced && groups < target && ceil_div(static_cast<std::uint64_t>(p.Tk), t->bc) >= 8) {
        pass(c.v, std::to_string(groups) + " workgroup(s) for a target of " + std::to_string(target) +
                      " and no split-KV in this kernel: a split-KV variant instead");
        continue;
      }
      s.variant = c.v;
      s.coop = *t;
      s.required_size = dev.subgroup_size_control;
      s.full_subgroups = dev.full_subgroups;
      return s;
    }
    pass(c.v, why);
  }

  // Decode-shaped problems (<= 16 query rows per kv head) on a GPU: flash_decode, whose
  // workgroups split the keys (flash_subgroup's teams would hold 1 live row in 8-16). Not on a
  // software device, where flash_subgroup's CPU regime (a lane per row, split-KV) is the one
  // measured.
  if (wants(Variant::flash_decode)) {
    const std::int64_t per_kv = p.Tq * (p.per_head_map ? 1 : p.Hq / p.Hkv);
    if (const std::string* why = disabled_why(Variant::flash_decode)) {
      pass(Variant::flash_decode, *why);
    } else if (!forced && dev.software) {
      pass(Variant::flash_decode, "software device (flash_subgroup's lane-per-row regime instead)");
    } else if (!forced && (p.Tq > kDecodeMaxTq || per_kv > kDecodeMaxRowsPerKvHead)) {
      pass(Variant::flash_decode, std::to_string(per_kv) + " query rows per kv head (decode-shaped: <= " +
                                      std::to_string(kDecodeMaxRowsPerKvHead) + ")");
    } else {
      std::string why;
      if (auto t = decode_tiles(dev, p, force, &why)) {
        s.variant = Variant::flash_decode;
        s.decode = *t;
        s.full_subgroups = dev.full_subgroups && t->wg % max_subgroup(dev) == 0;
        return s;
      }
      pass(Variant::flash_decode, why);
    }
  }

  if (wants(Variant::flash_subgroup) && disabled_why(Variant::flash_subgroup) != nullptr) {
    pass(Variant::flash_subgroup, *disabled_why(Variant::flash_subgroup));
  } else if (wants(Variant::flash_subgroup)) {
    std::string why;
    if (auto t = subgroup_tiles(dev, p, force, &why)) {
      s.variant = Variant::flash_subgroup;
      s.subgroup = *t;
      s.full_subgroups = dev.full_subgroups && t->wg % max_subgroup(dev) == 0;
      return s;
    }
    pass(Variant::flash_subgroup, why);
  }
  if (forced && *force.variant != Variant::flash_rowwise) {
    // The forced variant cannot run this problem: the normal choice, saying so.
    Selection normal = select_kernel(dev, caps, p, KernelOverride{}, disabled);
    std::vector<std::string> notes{std::string("forced ") + variant_name(*force.variant) + " not possible"};
    for (const std::string& r : s.not_taken)
      if (r.rfind("forced ", 0) != 0 &&
          std::find(normal.not_taken.begin(), normal.not_taken.end(), r) == normal.not_taken.end())
        notes.push_back(r);
    normal.not_taken.insert(normal.not_taken.begin(), notes.begin(), notes.end());
    return normal;
  }
  s.variant = Variant::flash_rowwise;
  if (const std::string* why = disabled_why(Variant::flash_rowwise)) {
    pass(Variant::flash_rowwise, *why);
    s.exhausted = true;
  }
  return s;
}

}  // namespace attnops::vulkan
