// What one problem runs on: operator x pass x backend x (cpu ISA tier | gpu kernel variant) x
// thread count, expanded from the command line against what this host runs, with a note for
// everything left out and why (a tier this CPU lacks, a thread count above its cores, no gpu).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/config.h"
#include "attnops/decision.h"
#include "attnops/registry.h"

namespace attnops::verify {

inline constexpr const char* kDenseOps[] = {"vanilla", "blocksparse", "flash_attn2"};
inline constexpr const char* kAllOps[] = {"vanilla",      "blocksparse", "flash_attn2",
                                          "ragged_paged", "ring",        "ulysses"};
inline constexpr const char* kTiers[] = {"baseline", "avx2", "avx512", "avx512bf16", "amx"};
// The Vulkan variants ATTNOPS_VK_KERNEL can force ("auto": none forced).
inline constexpr const char* kGpuKernels[] = {
    "auto",         "flash_subgroup",    "flash_rowwise",   "flash_decode",
    "vanilla_gemm", "flash_coopmat_khr", "flash_coopmat_nv"};

bool is_dense_op(const std::string& op);
bool is_dist_op(const std::string& op);

struct Target {
  std::string op;
  Pass pass = Pass::forward;
  Backend backend = Backend::cpu;
  std::string kernel;  // cpu: the ISA tier; gpu: the forced variant or "auto"; native: ""
  int threads = 1;     // cpu / native (gpu: 0)
  // "vanilla forward cpu avx2 threads=2": the flags of a replay (--ops --passes --backends
  // --tiers/--gpu-kernels --threads), as text() and as command-line arguments.
  std::string text() const;
  std::string flags() const;
};

struct TargetRequest {
  std::vector<std::string> ops;  // canonical names
  std::vector<Pass> passes;
  std::vector<Backend> backends;
  std::vector<std::string> tiers;  // {"all"} or names
  std::vector<int> threads;
  std::vector<std::string> gpu_kernels;  // {"all"} or names
};

struct TargetPlan {
  std::vector<Target> targets;     // every target; per case the gpu ones are narrowed to one variant
  std::vector<std::string> notes;  // what was left out and why, printed first
};

// Expands the request on `registry`'s host: cpu tiers up to the detected one (others skipped
// with the reason), thread counts clamped to the hardware threads (duplicates dropped, said),
// the gpu only when a device qualifies with software devices allowed.
TargetPlan plan_targets(const Registry& registry, const TargetRequest& request);

// A config that runs a call on exactly `backend` (every other backend disabled, so that a silent
// fallback to another backend is an error, not a pass) with `threads` threads (0: the default),
// software Vulkan devices allowed.
Config forced_config(Backend backend, int threads, std::optional<double> softmax_scale);

// Applies a target's environment for the calls that follow: ATTNOPS_CPU_ISA (and
// reload_environment(): the library reads it once per process otherwise) and ATTNOPS_VK_KERNEL.
void apply_environment(const Target& t);
// Restores both as they were before the first apply_environment.
void restore_environment();

}  // namespace attnops::verify
