// `attnops info`: what this host can run. For every registered operator and every backend:
// whether the dispatcher would try it, in which order, and why not; then the CPU's ISA, the ISA
// tier the cpu backend's kernels run (and why: what was detected, what the next tier lacks,
// ATTNOPS_CPU_ISA's cap), and the Vulkan devices the loader reports, with the limits attnops
// relies on and whether each qualifies under the current settings; last, the distributed operators
// (ring, ulysses) and how this build runs them.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "cli/commands.h"
#include "cli/dist/world.h"
#include "cli/settings.h"

namespace attnops::cli {
namespace {

struct InfoArgs {
  std::string config;
  bool allow_software = false;
  bool json = false;
};

// The order the dispatcher tries backends in (metadata.h): the configured list, then the auto
// order for those not listed. tpu is never in the auto order.
std::vector<Backend> candidate_order(const OperationMetadata& md) {
  std::vector<Backend> order = md.backends;
  for (Backend b : {Backend::gpu, Backend::cpu, Backend::native})
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  return order;
}

struct Row {
  std::string op, backend;
  int position = 0;  // 1-based place in the candidate order; 0 = not a candidate
  bool implements = false, available = false, disabled = false, tried = false;
  bool backward = false;  // the operator implements its backward on this backend
  std::string why_not;
};

std::vector<Row> operator_rows(const Config& config) {
  std::vector<Row> rows;
  const Host& host = registry().host();
  for (const std::string& name : registry().list()) {
    const Attention attn = registry().get(name, config);
    const OperationMetadata& md = attn.metadata();
    const std::vector<Backend> order = candidate_order(md);
    for (Backend b : {Backend::gpu, Backend::cpu, Backend::native, Backend::tpu}) {
      Row r;
      r.op = name;
      r.backend = std::string(backend_name(b));
      const auto at = std::find(order.begin(), order.end(), b);
      r.position = at == order.end() ? 0 : static_cast<int>(at - order.begin()) + 1;
      r.implements = attn.implements(b);
      r.backward = attn.implements_backward(b);
      const Availability av = host.availability(b, md.gpu);
      r.available = av.available;
      r.disabled = std::find(md.disabled_backends.begin(), md.disabled_backends.end(), b) !=
                   md.disabled_backends.end();
      r.tried = r.position > 0 && r.implements && r.available && !r.disabled;
      if (r.position == 0)
        r.why_not =
            "not in the candidate order (the auto order is gpu, cpu, native; name it with --backend or "
            "backend:)";
      else if (r.disabled)
        r.why_not = "disabled_by_config";
      else if (!r.available)
        r.why_not = "backend_unavailable: " + av.detail;
      else if (!r.implements)
        r.why_not = "not_implemented: " + name + " has no forward_" + r.backend;
      else
        r.why_not = av.detail.empty() ? "" : av.detail;  // e.g. which device
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

std::string yes(bool b) {
  return b ? "yes" : "no";
}

// The sequence-parallel operators (cli/dist/): not in the registry's table, since they run as
// one process per rank; how they run depends on whether this build has MPI.
struct DistOperator {
  std::string op, runs;
};
std::vector<DistOperator> distributed_operators() {
  std::vector<DistOperator> out;
  for (const char* op : {"ring", "ulysses"})
    out.push_back({op, built_with_mpi()
                           ? "under mpirun: mpirun -np P attnops run --op " + std::string(op) +
                                 " ... (one rank per process; without mpirun, one rank in this process)"
                           : "in one process (this build has no MPI): attnops run --op " + std::string(op) +
                                 " runs one rank, the local operator"});
  return out;
}

// What the serving path (ragged_paged over a PagedKVCache) offers on this host.
struct ServingInfo {
  std::vector<std::string> cache_dtypes{"f32", "f16", "bf16", "int8", "fp8_e4m3"};
  std::vector<std::string> scales{"per_token", "per_tensor"};
  std::string cpu, gpu, shared_prefixes;
  std::int64_t kv_split_tokens = kDefaultKvSplitTokens;
};

ServingInfo serving_info(const CpuInfo& cpu, bool any_gpu) {
  ServingInfo s;
  const bool f16c = cpu.cpu_tier != "baseline";
  s.cpu = "tier " + cpu.cpu_tier + ": decode (stream items) reads every cache dtype in place; int8 codes " +
          (f16c ? "sign-extended and converted in registers, e4m3 codes through the f16 bit pattern (F16C)"
                : "converted in registers, e4m3 codes through a table") +
          "; prefill (tile items) dequantizes an 8-bit sequence into q's dtype for the tiled kernel";
  s.gpu = any_gpu ? "paged_decode (stream sequences) on devices with subgroup shuffles, row-wise tasks "
                    "elsewhere; 8-bit pools read as words"
                  : "no qualifying Vulkan device";
  s.shared_prefixes =
      "on by default: splits that several decode sequences have in the same pages are read "
      "once for all of them (cpu; bitwise the unshared result)";
  return s;
}

int info(const InfoArgs& a) {
  Config config = load_optional_config(a.config);
  if (a.allow_software) config.gpu_allow_software = true;
  const std::vector<Row> rows = operator_rows(config);
  // Device selection settings are global (config top level), the same for every operator.
  const OperationMetadata md = registry().get(registry().list().front(), config).metadata();
  const Host& host = registry().host();
  const CpuInfo cpu = host.cpu();
  const std::vector<GpuDeviceInfo> gpus = host.gpu_devices(md.gpu);

  if (a.json) {
    nlohmann::json j;
    j["cpu"] = {{"isa", cpu.isa_summary},
                {"threads", cpu.threads},
                {"avx2", cpu.avx2},
                {"fma", cpu.fma},
                {"f16c", cpu.f16c},
                {"avx512f", cpu.avx512f},
                {"avx512bf16", cpu.avx512bf16},
                {"amx_tile", cpu.amx_tile},
                {"amx_bf16", cpu.amx_bf16},
                {"tier", cpu.cpu_tier},
                {"tier_detected", cpu.cpu_tier_detected},
                {"tier_detail", cpu.cpu_tier_detail}};
    j["gpu_devices"] = nlohmann::json::array();
    for (const auto& d : gpus)
      j["gpu_devices"].push_back({{"index", d.index},
                                  {"name", d.name},
                                  {"type", d.type},
                                  {"api_version", d.api_version},
                                  {"software", d.software},
                                  {"qualifies", d.qualifies},
                                  {"why_not", d.why_not},
                                  {"max_shared_memory", d.max_shared_memory},
                                  {"max_workgroup_invocations", d.max_workgroup_invocations},
                                  {"subgroup_size", d.subgroup_size},
                                  {"max_storage_buffer_range", d.max_storage_buffer_range},
                                  {"shader_f16", d.shader_f16},
                                  {"kernel_variants", d.kernel_variants},
                                  {"selfchecks", d.selfchecks}});
    const ServingInfo sv =
        serving_info(cpu, std::any_of(gpus.begin(), gpus.end(), [](const auto& d) { return d.qualifies; }));
    j["serving"] = {{"cache_dtypes", sv.cache_dtypes},
                    {"scales", sv.scales},
                    {"kv_split_tokens", sv.kv_split_tokens},
                    {"cpu", sv.cpu},
                    {"gpu", sv.gpu},
                    {"shared_prefixes", sv.shared_prefixes}};
    j["operators"] = nlohmann::json::array();
    for (const auto& r : rows)
      j["operators"].push_back({{"operator", r.op},
                                {"backend", r.backend},
                                {"order", r.position},
                                {"implements", r.implements},
                                {"implements_backward", r.backward},
                                {"available", r.available},
                                {"disabled", r.disabled},
                                {"tried", r.tried},
                                {"why_not", r.tried ? "" : r.why_not}});
    j["distributed_operators"] = nlohmann::json::array();
    for (const DistOperator& d : distributed_operators())
      j["distributed_operators"].push_back({{"operator", d.op},
                                            {"mpi", built_with_mpi()},
                                            {"local_operator", "flash_attn2"},
                                            {"runs", d.runs}});
    std::cout << j.dump(2) << "\n";
    return std::cout ? 0 : 2;
  }

  std::cout << "CPU: " << (cpu.isa_summary.empty() ? "(no SIMD extensions detected)" : cpu.isa_summary)
            << ", " << cpu.threads << " OpenMP threads\n";
  std::cout << "CPU kernels: ISA tier " << cpu.cpu_tier << " (" << cpu.cpu_tier_detail << ")\n";
  std::cout << "Vulkan devices (allow_software=" << yes(md.gpu.allow_software)
            << (md.gpu.device.empty() ? "" : ", device=" + md.gpu.device) << "): " << gpus.size() << "\n";
  for (const auto& d : gpus) {
    std::cout << "  #" << d.index << " " << d.name << "  type=" << d.type << "  api=" << d.api_version
              << "  shared_mem=" << d.max_shared_memory << "  max_invocations=" << d.max_workgroup_invocations
              << "  subgroup=" << d.subgroup_size << "  storage_range=" << d.max_storage_buffer_range
              << "  f16=" << yes(d.shader_f16) << "\n      qualifies: " << yes(d.qualifies)
              << (d.qualifies ? "" : " (" + d.why_not + ")") << "\n";
    for (const std::string& v : d.kernel_variants) std::cout << "      kernel " << v << "\n";
    for (const std::string& c : d.selfchecks) std::cout << "      self-check " << c << "\n";
    if (d.qualifies && d.selfchecks.empty())
      std::cout << "      self-check: none recorded (run once with gpu.pipeline_cache set to keep them)\n";
  }
  const ServingInfo sv =
      serving_info(cpu, std::any_of(gpus.begin(), gpus.end(), [](const auto& d) { return d.qualifies; }));
  std::cout << "\nServing (ragged_paged over a PagedKVCache): cache dtypes";
  for (const std::string& t : sv.cache_dtypes) std::cout << " " << t;
  std::cout << " (8-bit: scales per_token or per_tensor); splits of " << sv.kv_split_tokens << " keys\n"
            << "  cpu: " << sv.cpu << "\n  gpu: " << sv.gpu << "\n  shared prefixes: " << sv.shared_prefixes
            << "\n";
  std::cout << "\nOperators x backends (order = place in the list the dispatcher tries):\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %-7s %-5s %-10s %-8s %-9s %-5s %s\n", "operator", "backend",
                "order", "implements", "backward", "available", "tried", "why not / detail");
  std::cout << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-12s %-7s %-5s %-10s %-8s %-9s %-5s ", r.op.c_str(), r.backend.c_str(),
                  r.position ? std::to_string(r.position).c_str() : "-", yes(r.implements).c_str(),
                  yes(r.backward).c_str(), yes(r.available).c_str(), yes(r.tried).c_str());
    std::cout << line << r.why_not << "\n";
  }
  std::cout << "\nDistributed operators (sequence parallel; each rank runs a local operator, flash_attn2 by "
               "default; MPI: "
            << yes(built_with_mpi()) << "):\n";
  for (const DistOperator& d : distributed_operators()) {
    std::snprintf(line, sizeof line, "  %-10s ", d.op.c_str());
    std::cout << line << d.runs << "\n";
  }
  return std::cout ? 0 : 2;
}

}  // namespace

Command add_info_command(CLI::App& root) {
  auto a = std::make_shared<InfoArgs>();
  CLI::App* app =
      root.add_subcommand("info", "Operators x backends on this host, CPU ISA and Vulkan devices");
  app->add_option("--config", a->config,
                  "YAML configuration (backend order, disabled backends, gpu settings)");
  app->add_flag("--allow-software", a->allow_software, "Let software Vulkan devices (lavapipe) qualify");
  app->add_flag("--json", a->json, "Print JSON instead of tables");
  return {app, [a] { return info(*a); }};
}

}  // namespace attnops::cli
