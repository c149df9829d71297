#include "verify/target.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "attnops/environment.h"
#include "attnops/ext/problem.h"

namespace attnops::verify {

bool is_dense_op(const std::string& op) {
  return op == "vanilla" || op == "blocksparse" || op == "flash_attn2";
}
bool is_dist_op(const std::string& op) {
  return op == "ring" || op == "ulysses";
}

std::string Target::text() const {
  std::string s = op + " " + std::string(pass_name(pass)) + " " + std::string(backend_name(backend));
  if (!kernel.empty()) s += " " + kernel;
  if (backend != Backend::gpu) s += " threads=" + std::to_string(threads);
  return s;
}

std::string Target::flags() const {
  std::string s = "--ops " + op + " --passes " + std::string(pass_name(pass)) + " --backends " +
                  std::string(backend_name(backend));
  if (backend == Backend::cpu) s += " --tiers " + kernel;
  if (backend == Backend::gpu) s += " --gpu-kernels " + kernel;
  if (backend != Backend::gpu) s += " --threads " + std::to_string(threads);
  return s;
}

namespace {

int tier_index(const std::string& t) {
  for (int i = 0; i < 5; ++i)
    if (t == kTiers[i]) return i;
  return -1;
}

}  // namespace

TargetPlan plan_targets(const Registry& registry, const TargetRequest& r) {
  TargetPlan plan;
  const CpuInfo cpu = registry.host().cpu();
  const int detected = tier_index(cpu.cpu_tier_detected);
  std::vector<std::string> tiers;
  const bool want_cpu = std::find(r.backends.begin(), r.backends.end(), Backend::cpu) != r.backends.end();
  const bool all_tiers = r.tiers.empty() || (r.tiers.size() == 1 && r.tiers[0] == "all");
  for (int i = 0; i < 5; ++i) {
    const bool asked = all_tiers || std::find(r.tiers.begin(), r.tiers.end(), kTiers[i]) != r.tiers.end();
    if (!asked) continue;
    if (i <= detected)
      tiers.push_back(kTiers[i]);
    else if (want_cpu)
      plan.notes.push_back(std::string("tier ") + kTiers[i] + " skipped: this CPU runs up to " +
                           cpu.cpu_tier_detected + " (" + cpu.cpu_tier_detail + ")");
  }
  std::vector<int> threads;
  const int hw = max_worker_threads();
  for (int t : r.threads) {
    const int eff = std::clamp(t, 1, hw);
    const std::string note = "threads " + std::to_string(t) + " runs as " + std::to_string(eff) + " (" +
                             std::to_string(hw) + " hardware threads: the library clamps num_threads)";
    const bool host_threads =
        want_cpu || std::find(r.backends.begin(), r.backends.end(), Backend::native) != r.backends.end();
    if (eff != t && host_threads && std::find(plan.notes.begin(), plan.notes.end(), note) == plan.notes.end())
      plan.notes.push_back(note);
    if (std::find(threads.begin(), threads.end(), eff) == threads.end()) threads.push_back(eff);
  }
  std::vector<std::string> gpu_kernels;
  const bool all_kernels = r.gpu_kernels.empty() || (r.gpu_kernels.size() == 1 && r.gpu_kernels[0] == "all");
  for (const char* k : kGpuKernels)
    if (all_kernels || std::find(r.gpu_kernels.begin(), r.gpu_kernels.end(), k) != r.gpu_kernels.end())
      gpu_kernels.push_back(k);
  bool gpu_ok = true;
  if (std::find(r.backends.begin(), r.backends.end(), Backend::gpu) != r.backends.end()) {
    GpuSettings g;
    g.allow_software = true;
    const Availability a = registry.host().availability(Backend::gpu, g);
    gpu_ok = a.available;
    if (!gpu_ok) plan.notes.push_back("backend gpu skipped: " + a.detail);
  }
  for (Pass pass : r.passes)
    for (const std::string& op : r.ops) {
      if (op == "ragged_paged" && pass == Pass::backward) continue;  // no paged backward
      for (Backend b : r.backends) {
        if (b == Backend::gpu && !gpu_ok) continue;
        if (b == Backend::gpu) {
          for (const std::string& k : gpu_kernels) plan.targets.push_back({op, pass, b, k, 0});
          continue;
        }
        const std::vector<std::string> kernels = b == Backend::cpu ? tiers : std::vector<std::string>{""};
        for (const std::string& k : kernels)
          for (int t : threads) plan.targets.push_back({op, pass, b, k, t});
      }
    }
  if (want_cpu) {
    std::string runs = "runs cpu tiers";
    for (const std::string& t : tiers) runs += " " + t;
    runs += "; threads";
    for (int t : threads) runs += " " + std::to_string(t);
    plan.notes.push_back(runs);
  }
  if (std::find(r.ops.begin(), r.ops.end(), "ragged_paged") != r.ops.end() &&
      std::find(r.passes.begin(), r.passes.end(), Pass::backward) != r.passes.end())
    plan.notes.push_back("ragged_paged backward skipped: the paged operator has no backward");
  return plan;
}

Config forced_config(Backend backend, int threads, std::optional<double> softmax_scale) {
  Config c;
  c.source = "<verify>";
  c.backends = std::vector<Backend>{backend};
  std::vector<Backend> off;
  for (Backend b : {Backend::native, Backend::cpu, Backend::gpu, Backend::tpu})
    if (b != backend) off.push_back(b);
  c.disabled_backends = off;
  if (threads > 0) c.num_threads = threads;
  c.softmax_scale = softmax_scale;
  if (backend == Backend::gpu) c.gpu_allow_software = true;
  return c;
}

namespace {

struct Saved {
  bool taken = false;
  std::optional<std::string> isa, vk;
  std::optional<std::string> isa_now, vk_now;  // what apply_environment last set (nullopt: nothing yet)
};
Saved& saved() {
  static Saved s;
  return s;
}

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

void put(const char* name, const std::optional<std::string>& v) {
  if (v)
    setenv(name, v->c_str(), 1);
  else
    unsetenv(name);
}

}  // namespace

void apply_environment(const Target& t) {
  Saved& s = saved();
  if (!s.taken) s.taken = true, s.isa = get("ATTNOPS_CPU_ISA"), s.vk = get("ATTNOPS_VK_KERNEL");
  const std::string isa = t.backend == Backend::cpu ? t.kernel : "";
  const std::string vk = t.backend == Backend::gpu && t.kernel != "auto" ? t.kernel : "";
  if (vk != s.vk_now) {
    put("ATTNOPS_VK_KERNEL", vk.empty() ? std::nullopt : std::optional<std::string>(vk));
    s.vk_now = vk;
  }
  if (isa != s.isa_now) {
    put("ATTNOPS_CPU_ISA", isa.empty() ? s.isa : std::optional<std::string>(isa));
    s.isa_now = isa;
    reload_environment();
  }
}

void restore_environment() {
  Saved& s = saved();
  if (!s.taken) return;
  put("ATTNOPS_CPU_ISA", s.isa);
  put("ATTNOPS_VK_KERNEL", s.vk);
  s.isa_now.reset();
  s.vk_now.reset();
  reload_environment();
}

}  // namespace attnops::verify
