// The self-check of each kernel configuration on first use (vk_selfcheck.h): the fixed problem,
// its comparison with the fp64 oracle, the per-process results and the cache file beside the
// pipeline cache.
#include "backends/vulkan/vk_selfcheck.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "attnops/error.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/vulkan/vk_attention.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_launch.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vk_shader_table.h"
#include "backends/vulkan/vulkan_debug.h"
#include "core/cache_file.h"

#ifndef ATTNOPS_VERSION
#define ATTNOPS_VERSION "unknown"
#endif

namespace attnops::vulkan {

namespace {

constexpr std::size_t kMaxCacheFileBytes = std::size_t{256} << 10;
constexpr const char* kFileMagic = "attnops-selfcheck 1";

enum class Mode { on, off, force };
Mode mode() {
  std::string v = rt::env_string("ATTNOPS_VK_SELFTEST");
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "0" || v == "off" || v == "no" || v == "false") return Mode::off;
  if (v == "force" || v == "always") return Mode::force;
  return Mode::on;
}

// FNV-1a over every embedded shader: a cache written by another build of the kernels is stale.
std::uint64_t shader_hash() {
  static const std::uint64_t h = [] {
    std::uint64_t x = 1469598103934665603ull;
    for (std::uint32_t i = 0; i < static_cast<std::uint32_t>(rt::ShaderId::count_); ++i) {
      const rt::ShaderBlob& b = rt::shader_blob(static_cast<rt::ShaderId>(i));
      for (std::size_t w = 0; w < b.words; ++w) x = (x ^ b.code[w]) * 1099511628211ull;
    }
    return x;
  }();
  return h;
}

// The device, its driver and this build of attnops, as one line.
std::string identity(const rt::PhysicalDevice& pd) {
  char uuid[33];
  for (int i = 0; i < 16; ++i) std::snprintf(uuid + 2 * i, 3, "%02x", pd.cache_uuid[i]);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04x:%04x driver %u uuid %s", pd.vendor_id, pd.device_id, pd.driver_version,
                uuid);
  char hash[24];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(shader_hash()));
  return pd.info.name + " (" + buf + ") attnops " + ATTNOPS_VERSION + " shaders " + hash;
}

struct Registry {
  std::mutex mu;
  std::map<std::string, std::map<std::string, SelfCheckEntry>> results;  // identity -> key -> entry
  std::map<std::string, std::map<std::string, std::string>> hung;        // identity -> variant -> why
  std::set<std::string> loaded;                                          // identity + "\n" + path read
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed (no teardown from exit())
  return *r;
}

std::string cache_path(const GpuSettings& settings) {
  return settings.pipeline_cache.empty() ? "" : settings.pipeline_cache + ".selfcheck";
}

// Reads the cache file into the registry once per (identity, path). Requires registry().mu.
void load_locked(Registry& reg, const std::string& id, const std::string& path) {
  if (path.empty() || mode() == Mode::force || !reg.loaded.insert(id + "\n" + path).second) return;
  const CacheFileRead r = read_cache_file(path, kMaxCacheFileBytes);
  if (r.status == CacheFileRead::Status::missing) return;
  if (r.status != CacheFileRead::Status::ok) {
    warn_cache_file_once("Vulkan self-check cache", path, r.why, "ignored (the checks run again)");
    return;
  }
  std::istringstream in(r.bytes);
  std::string line;
  if (!std::getline(in, line) || line != kFileMagic) {
    warn_cache_file_once("Vulkan self-check cache", path, "not a self-check cache",
                         "ignored (the checks run again)");
    return;
  }
  if (!std::getline(in, line) || line != "identity " + id) return;  // another device, driver or build
  auto& mine = reg.results[id];
  while (std::getline(in, line)) {
    const auto t1 = line.find('\t'), t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string::npos) continue;
    const std::string verdict = line.substr(0, t1), key = line.substr(t1 + 1, t2 - t1 - 1);
    if (verdict == "hang" && parse_variant(key)) {  // a variant that hung: off for every configuration
      reg.hung[id].emplace(key, line.substr(t2 + 1));
      continue;
    }
    if (verdict != "pass" && verdict != "fail") continue;
    SelfCheckEntry e{key, verdict == "pass", line.substr(t2 + 1)};
    e.hung = e.detail.rfind("hung: ", 0) == 0;
    mine.emplace(e.key, e);
  }
}

// Rewrites the cache file with this identity's results. Requires registry().mu.
void save_locked(Registry& reg, const std::string& id, const std::string& path) {
  if (path.empty()) return;
  std::string why;
  if (!cache_file_writable(path, &why)) {
    warn_cache_file_once("Vulkan self-check cache", path, why, "not written");
    return;
  }
  const auto one_line = [](std::string t) {
    std::replace(t.begin(), t.end(), '\n', ' ');
    std::replace(t.begin(), t.end(), '\t', ' ');
    return t;
  };
  std::string text = std::string(kFileMagic) + "\nidentity " + id + "\n";
  for (const auto& [variant, why] : reg.hung[id]) text += "hang\t" + variant + "\t" + one_line(why) + "\n";
  for (const auto& [key, e] : reg.results[id])
    text += (e.passed ? "pass\t" : "fail\t") + key + "\t" + one_line(e.detail) + "\n";
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (fd >= 0) std::remove(tmp.c_str());
    warn_cache_file_once("Vulkan self-check cache", path, std::strerror(errno), "not written");
  }
}

// The alignment class of the call's q/k/v rows, which picks the specialization (ALIGNED) of the
// tiled kernels and the load paths of the others: 2 rows of whole 16-byte vectors on 16-byte
// boundaries (kVec) and multiples of 4 elements (kAligned4), 1 only the latter, 0 neither. As
// set_alignment_flags decides it; the self-check must run the same pipeline and paths.
int alignment_class(const AttentionProblem& p) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(p.dtype));
  bool four = p.D % 4 == 0 && p.Dv % 4 == 0, vec = p.D * es % 16 == 0 && p.Dv * es % 16 == 0;
  for (const TensorView* t : {&p.q, &p.k, &p.v})
    if (t->on_device())
      for (std::int64_t e : {t->device_offset(), t->stride(0), t->stride(1)}) {
        four = four && e % 4 == 0;
        vec = vec && e * es % 16 == 0;
      }
  return !four ? 0 : vec ? 2 : 1;
}
// The configuration a selection runs: what decides its pipelines (specialization constants).
std::string config_key(const Selection& s, const AttentionProblem& p) {
  std::ostringstream k;
  k << variant_name(s.variant) << " " << dtype_name(p.dtype) << " D" << p.D << " Dv" << p.Dv;
  switch (s.variant) {
    case Variant::flash_subgroup: {
      const SubgroupTiles& t = s.subgroup;
      k << " wg" << t.wg << " ds" << t.ds << " rpt" << t.rpt << " bc" << t.bc << " ku" << t.ku
        << (t.one_subgroup ? " one" : "") << (t.nsplit > 1 ? " split" : "") << " rows" << t.q_rows << "x"
        << t.head_rows;
      break;
    }
    case Variant::flash_decode: {
      const DecodeTiles& t = s.decode;
      k << " wg" << t.wg << " ds" << t.ds << " ku" << t.ku << " R" << t.rows << (t.nsplit > 1 ? " split" : "")
        << " rows" << t.q_rows << "x" << t.head_rows;
      break;
    }
    case Variant::flash_coopmat_khr:
    case Variant::flash_coopmat_nv:
      k << " sg" << s.coop.subgroup << " nsg" << s.coop.subgroups << " bc" << s.coop.bc << " rows"
        << s.coop.q_rows << "x" << s.coop.head_rows;
      break;
    case Variant::vanilla_gemm:
    case Variant::flash_rowwise:
      break;
  }
  const int align = alignment_class(p);
  k << (align == 2 ? " vec" : align == 1 ? " aligned" : " unaligned");
  return k.str();
}

// Deterministic values in [-1, 1), rounded to the tensor's dtype.
void fill(Tensor& t, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    t.set(static_cast<std::size_t>(i), static_cast<float>(x >> 8) / 8388608.0f - 1.0f);
  }
}

// The fixed problem of a configuration: the call's dtype and head dims, q heads as the tiles pack
// them, two q blocks (the second partial), three kv tiles (the last partial), bottom-right causal
// with a sliding window (empty, full and partial tiles), sinks, a bias whose row 1 of head 0 is
// -inf everywhere (a fully masked row: out 0, lse -inf), NaN in q row 2 of head 0 (a NaN row), and
// NaN in v of the last key, which only the last rows see (it must reach them and nothing else).
struct CheckCase {
  Tensor q, k, v, bias, sinks;
  AttentionProblem p;
};
CheckCase make_check_case(const AttentionProblem& call, const Selection& s) {
  const MapTile tile = map_tile(s);
  std::int64_t head_rows = 1;
  if (s.variant == Variant::flash_subgroup) head_rows = s.subgroup.head_rows;
  if (s.variant == Variant::flash_decode) head_rows = s.decode.head_rows;
  if (s.variant == Variant::flash_coopmat_khr || s.variant == Variant::flash_coopmat_nv)
    head_rows = s.coop.head_rows;
  const std::int64_t Hkv = 1, Hq = std::max<std::int64_t>(head_rows, 2) / head_rows * head_rows;
  const std::int64_t Tq = tile.bq + 3, Tk = 2 * tile.bk + 5, D = call.D, Dv = call.Dv;
  CheckCase c{Tensor(call.dtype, {1, Tq, Hq, D}),
              Tensor(call.dtype, {1, Tk, Hkv, D}),
              Tensor(call.dtype, {1, Tk, Hkv, Dv}),
              Tensor(DType::f32, {1, Hq, Tq, Tk}),
              Tensor(DType::f32, {Hq}),
              {}};
  fill(c.q, 1);
  fill(c.k, 2);
  fill(c.v, 3);
  fill(c.bias, 4);
  fill(c.sinks, 5);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  if (Tq > 2) {
    for (std::int64_t j = 0; j < Tk; ++j) c.bias.set(static_cast<std::size_t>(1 * Tk + j), -inf);
    for (std::int64_t d = 0; d < D; ++d) c.q.set(static_cast<std::size_t>((2 * Hq + 0) * D + d), nan);
  }
  for (std::int64_t d = 0; d < Dv; ++d) c.v.set(static_cast<std::size_t>((Tk - 1) * Dv + d), nan);
  AttentionOptions o;
  o.causal = true;
  o.sliding_window = Window{tile.bk, 0};
  o.bias = c.bias.view();
  o.sinks = c.sinks.view();
  o.return_lse = true;
  c.p = make_problem(c.q, c.k, c.v, o, OperationMetadata{});
  return c;
}

// "" when `got` matches the oracle: the same class (NaN, +inf, -inf, finite) everywhere, finite
// values within the dtype's tolerance; else what differed first.
std::string compare(const AttentionProblem& p, const AttentionBuffers& got) {
  const native::ReferenceResult want = native::reference_attention_f64(p, false);
  const double tol = p.dtype == DType::f32 ? 1e-4 : p.dtype == DType::f16 ? 4e-3 : 3e-2;
  const auto cls = [](double x) { return std::isnan(x) ? 0 : std::isinf(x) ? (x > 0 ? 1 : 2) : 3; };
  const auto check = [&](const char* what, std::size_t i, double g, double w, double t) -> std::string {
    if (cls(g) != cls(w) || (cls(w) == 3 && std::abs(g - w) > t * std::max(1.0, std::abs(w)))) {
      std::ostringstream os;
      os << what << "[" << i << "] = " << g << ", the oracle says " << w;
      return os.str();
    }
    return "";
  };
  for (std::size_t i = 0; i < want.out.size(); ++i)
    if (std::string e = check("out", i, got.out.at(i), want.out[i], tol); !e.empty()) return e;
  if (got.lse)
    for (std::size_t i = 0; i < want.lse.size(); ++i)
      if (std::string e = check("lse", i, got.lse->at(i), want.lse[i], 1e-3); !e.empty()) return e;
  return "";
}

bool wrong_result_injected(Variant v) {
  return debug::injected_fault() == debug::Fault::wrong_result && debug::fault_applies_to(variant_name(v));
}

SelfCheckEntry run_check(Kernel kernel, const AttentionProblem& call, const Selection& sel,
                         const std::shared_ptr<rt::Device>& dev, const std::string& key) {
  CheckCase c = make_check_case(call, sel);
  if (auto why = limits_reason(kernel, c.p, dev->physical(), sel))
    return {key, true, "not checked: " + why->detail};  // the call's own limits gate it
  AttentionBuffers b = allocate_buffers(c.p);
  const int align = alignment_class(call);
  const std::uint32_t clear = align == 0 ? kVec | kAligned4 : align == 1 ? kVec : 0u;
  // The pipelines first, under the call's timeout: a driver that compiles them at their first
  // dispatch (lavapipe: seconds under load) does it in this submission of empty dispatches, so
  // that the timed one below runs the kernels alone.
  run_selected(kernel, c.p, nullptr, dev, sel, "", b, clear, /*compile_only=*/true);
  const std::uint64_t timeout_ms = selfcheck_timeout_ms(c.p);
  try {
    const rt::ScopedFenceTimeout short_wait(timeout_ms * 1000000ull);
    run_selected(kernel, c.p, nullptr, dev, sel, "", b, clear);  // other gpu_errors propagate
  } catch (const Error& e) {
    if (e.code() != ErrorCode::gpu_error || !dev->hung()) throw;
    SelfCheckEntry hung{
        key, false,
        "hung: its check did not finish within " +
            std::to_string(std::min(timeout_ms, dev->fence_timeout_ns() / 1000000)) +
            " ms (fence wait timed out; the problem takes milliseconds): the variant is off on "
            "this device"};
    hung.hung = true;
    return hung;
  }
  if (wrong_result_injected(sel.variant)) b.out.set(0, b.out.at(0) + 0.5f);  // debug::Fault::wrong_result
  const std::string err = compare(c.p, b);
  if (err.empty())
    return {key, true,
            "matches the fp64 oracle (" + std::to_string(c.p.Tq) + "x" + std::to_string(c.p.Tk) +
                ", NaN / -inf / masked rows)"};
  return {key, false, err};
}

}  // namespace

std::uint64_t selfcheck_timeout_ms(const AttentionProblem& p) {
  if (const std::string t = rt::env_string("ATTNOPS_VK_SELFTEST_TIMEOUT_MS"); !t.empty()) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(t.c_str(), &end, 10);
    if (end != t.c_str() && *end == '\0' && v > 0 && v < 86400000ull) return v;
  }
  const double flops =
      4.0 * static_cast<double>(p.B * p.Hq * p.Tq * p.Tk) * static_cast<double>(std::max(p.D, p.Dv));
  return 2000 + static_cast<std::uint64_t>(flops / 1e5);
}

std::optional<Selection> checked_selection(Kernel kernel, const AttentionProblem& p,
                                           const rt::PhysicalDevice& pd, std::shared_ptr<rt::Device>& dev,
                                           const GpuSettings& settings, std::string* why) {
  const std::string id = identity(pd), path = cache_path(settings);
  std::vector<DisabledVariant> disabled;
  {  // variants that hung on this device (this process, or the cache file): never selected
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    load_locked(reg, id, path);
    for (const auto& [name, seen] : reg.hung[id])
      if (const std::optional<Variant> v = parse_variant(name))
        disabled.push_back({*v, "selftest_failed: " + seen});
  }
  const Mode m = mode();
  for (;;) {
    Selection sel = select_for(kernel, p, pd, disabled);
    if (sel.exhausted) {
      std::string seen;
      for (const DisabledVariant& d : disabled)
        seen += std::string(seen.empty() ? "" : "; ") + variant_name(d.variant) + ": " + d.why;
      if (why != nullptr)
        *why = "selftest_failed: no kernel variant passed its self-check on this device (" + seen + ")";
      return std::nullopt;
    }
    if (m == Mode::off) {
      sel.selfcheck = "off (ATTNOPS_VK_SELFTEST=0)";
      return sel;
    }
    // Nothing to check when nothing runs, or when the call is over the device's limits (the
    // caller reports those).
    if (p.B == 0 || p.Tq == 0 || p.Tk == 0 || p.Hq == 0 || p.D == 0 || p.Dv == 0 ||
        limits_reason(kernel, p, pd, sel))
      return sel;
    const std::string key = config_key(sel, p);
    std::optional<SelfCheckEntry> known;
    {
      Registry& reg = registry();
      std::lock_guard<std::mutex> lock(reg.mu);
      const auto& mine = reg.results[id];
      if (auto it = mine.find(key); it != mine.end()) known = it->second;
    }
    if (!known) {
      if (!dev || dev->lost()) dev = rt::device(settings);  // none yet, or a check before this one hung on it
      known = run_check(kernel, p, sel, dev, key);
      Registry& reg = registry();
      std::lock_guard<std::mutex> lock(reg.mu);
      reg.results[id][key] = *known;
      if (known->hung) reg.hung[id][variant_name(sel.variant)] = known->detail;
      save_locked(reg, id, path);
    }
    if (known->passed) {
      sel.selfcheck = "passed";
      return sel;
    }
    disabled.push_back({sel.variant, "selftest_failed: " + known->detail});
  }
}

void note_call_timeout(const rt::PhysicalDevice& pd, Variant variant, const GpuSettings& settings) {
  const std::string id = identity(pd), path = cache_path(settings),
                    prefix = std::string(variant_name(variant)) + " ";
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  load_locked(reg, id, path);
  auto& mine = reg.results[id];
  bool forgot = false;
  for (auto it = mine.begin(); it != mine.end();)
    if (it->second.passed && it->first.rfind(prefix, 0) == 0) {
      it = mine.erase(it);
      forgot = true;
    } else {
      ++it;
    }
  if (forgot) save_locked(reg, id, path);
}

std::vector<SelfCheckEntry> selfcheck_results(const GpuSettings& settings) {
  std::string unused;
  const int index = rt::selected_index(settings, &unused);
  if (index < 0) return {};
  const std::string id = identity(rt::instance().devices()[static_cast<std::size_t>(index)]);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  load_locked(reg, id, cache_path(settings));
  std::vector<SelfCheckEntry> out;
  for (const auto& [variant, seen] : reg.hung[id]) {
    SelfCheckEntry e{variant + " (every configuration)", false, seen};
    e.hung = true;
    out.push_back(e);
  }
  for (const auto& [key, e] : reg.results[id]) out.push_back(e);
  return out;
}

std::vector<SelfCheckEntry> run_selfchecks(const GpuSettings& settings) {
  std::shared_ptr<rt::Device> dev = rt::device(settings);
  const rt::PhysicalDevice pd = dev->physical();
  // Canonical problems: prefill (T 64) and decode (Tq 1, Tk 512, GQA 8) in f32 and f16, D 64,
  // each variant forced in turn (the ones the device cannot run fall back to the normal choice);
  // flash_decode on the decode problem only (the one it is taken for).
  for (DType t : {DType::f32, DType::f16})
    for (const auto& [Tq, Tk, Hq] :
         {std::tuple<std::int64_t, std::int64_t, std::int64_t>{64, 64, 4}, {1, 512, 8}})
      for (Variant v : {Variant::flash_coopmat_khr, Variant::flash_coopmat_nv, Variant::flash_decode,
                        Variant::flash_subgroup, Variant::flash_rowwise, Variant::vanilla_gemm}) {
        if (v == Variant::flash_decode && Tq > kDecodeMaxTq) continue;
        Tensor q(t, {1, Tq, Hq, 64}), k(t, {1, Tk, 1, 64});
        fill(q, 7);
        fill(k, 8);
        AttentionOptions o;
        const AttentionProblem p = make_problem(q, k, k, o, OperationMetadata{});
        KernelOverride force = debug::kernel_override();
        const KernelOverride saved = force;
        force.variant = v;
        debug::set_kernel_override(force);
        std::string why;
        try {
          checked_selection(v == Variant::vanilla_gemm ? Kernel::vanilla : Kernel::flash, p, pd, dev,
                            settings, &why);
        } catch (...) {
          debug::set_kernel_override(saved);
          throw;
        }
        debug::set_kernel_override(saved);
      }
  return selfcheck_results(settings);
}

void reset_selfchecks() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.results.clear();
  reg.hung.clear();
  reg.loaded.clear();
}

}  // namespace attnops::vulkan
