// The self-check (README "Self-check"): the first time a kernel configuration is selected on a
// device and driver, it runs a small fixed problem first -- partial and empty tiles, a fully
// masked row (a -inf bias row), a NaN row (NaN in q), a NaN in a key no row sees, sinks -- with
// exactly the call's pipelines (variant, dtype, tiles, head dims), and the answer is compared
// with the fp64 oracle (backends/native), NaN / inf classes included. A configuration that
// disagrees is disabled for that problem shape, named in the decision with `selftest_failed`
// and the error seen, and the next variant runs; when no variant passes, the gpu backend is
// refused with reason `selftest_failed` and the next backend runs.
//
// Results are kept per process and, when gpu.pipeline_cache is set, in `<pipeline_cache>.selfcheck`
// beside it (read with a bound, core/cache_file.h), valid for one device, driver version,
// attnops version and set of shaders. ATTNOPS_VK_SELFTEST=0 skips the check (every variant is
// trusted), =force runs it again in this process whatever the cache holds. Internal to
// backends/vulkan.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnops/metadata.h"
#include "attnops/problem.h"
#include "backends/vulkan/vk_instance.h"
#include "backends/vulkan/vk_kernel_select.h"
#include "backends/vulkan/vulkan_backend.h"

namespace attnops::vulkan {

namespace rt {
class Device;
}

// The selection for a call with its configuration self-checked: the variant select_for chose
// once it passed (the check run now if it never ran here), else the next variant; nullopt with
// *why ("selftest_failed: ...") when every variant that could run the problem failed.
std::optional<Selection> checked_selection(Kernel kernel, const AttentionProblem& p,
                                           const std::shared_ptr<rt::Device>& dev,
                                           const GpuSettings& settings, std::string* why);

// One configuration's result, as `attnops info` shows it.
struct SelfCheckEntry {
  std::string key;  // "flash_subgroup f32 D64 Dv64 spec 8,0,1,4,32,16,16,0,1,1,1"
  bool passed = false;
  std::string detail;  // the error seen, or what was compared
};
// Results known for the device `settings` select: this process's, and the cache file's.
std::vector<SelfCheckEntry> selfcheck_results(const GpuSettings& settings);
// Runs the check of each variant the device can run on a canonical problem (f32 and f16, head
// dim 64, prefill and decode shapes), as `attnops info --selfcheck` does; returns the results.
std::vector<SelfCheckEntry> run_selfchecks(const GpuSettings& settings);
// Forgets this process's results (tests).
void reset_selfchecks();

}  // namespace attnops::vulkan
