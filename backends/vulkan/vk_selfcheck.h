// The self-check (README "Self-check"): the first time a kernel configuration is selected on a
// device and driver, it runs a small fixed problem first -- partial and empty tiles, a fully
// masked row (a -inf bias row), a NaN row (NaN in q), a NaN in a key no row sees, sinks -- with
// exactly the call's pipelines (variant, dtype, tiles, head dims), and the answer is compared
// with the fp64 oracle (backends/native), NaN / inf classes included. A configuration that
// disagrees is disabled for that problem shape, named in the decision with `selftest_failed`
// and the error seen, and the next variant runs; when no variant passes, the gpu backend is
// refused with reason `selftest_failed` and the next backend runs.
//
// A check whose submission does not finish within its short timeout (selfcheck_timeout_ms: its
// problem is tiny) hung: the variant is disabled on that device for every configuration, for the
// process and in the cache file, the abandoned device is replaced and the next variant checked,
// so a hung kernel costs one short timeout, once. A call that times out (vk_attention.cpp) has
// its variant's passed checks forgotten, so that the next call checks it again under the short
// timeout before trusting it.
//
// Results are kept per process and, when gpu.pipeline_cache is set, in `<pipeline_cache>.selfcheck`
// beside it (read with a bound, core/cache_file.h), valid for one device, driver version,
// attnops version and set of shaders. ATTNOPS_VK_SELFTEST=0 skips the check (every variant is
// trusted), =force runs it again in this process whatever the cache holds. Internal to
// backends/vulkan.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnops/ext/problem.h"
#include "attnops/metadata.h"
#include "backends/vulkan/vk_instance.h"
#include "backends/vulkan/vk_kernel_select.h"
#include "backends/vulkan/vulkan_backend.h"

namespace attnops::vulkan {

namespace rt {
class Device;
}

// The selection for a call with its configuration self-checked: the variant select_for chose
// once it passed (the check run now if it never ran here), else the next variant; nullopt with
// *why ("selftest_failed: ...") when every variant that could run the problem failed or hung.
// The checks run on `dev`, which is made (rt::device) only when a check must run and it is null
// or lost (a check before it hung: the runtime abandoned it), so a device whose variants are all
// known to have hung or failed makes no device.
std::optional<Selection> checked_selection(Kernel kernel, const AttentionProblem& p,
                                           const rt::PhysicalDevice& pd, std::shared_ptr<rt::Device>& dev,
                                           const GpuSettings& settings, std::string* why);

// The fence timeout of a check's submission, in ms: 2 s plus 10 ms per MFLOP of its problem (100
// MFLOP/s, far below any device's rate), never more than the calls' (ATTNOPS_VK_TIMEOUT_MS);
// ATTNOPS_VK_SELFTEST_TIMEOUT_MS sets it.
std::uint64_t selfcheck_timeout_ms(const AttentionProblem& check_problem);

// A call of `variant` on device `pd` whose fence wait timed out: the variant's passed checks on
// that device are forgotten (here and in the cache file), so that it is checked again.
void note_call_timeout(const rt::PhysicalDevice& pd, Variant variant, const GpuSettings& settings);

// One configuration's result, as `attnops info` shows it.
struct SelfCheckEntry {
  std::string key;  // "flash_subgroup f32 D64 Dv64 spec 8,0,1,4,32,16,16,0,1,1,1"
  bool passed = false;
  std::string detail;  // the error seen, or what was compared
  bool hung = false;   // its submission timed out: the variant is off on the device
};
// Results known for the device `settings` select: this process's, and the cache file's; a variant
// that hung is listed once more as "<variant> (every configuration)".
std::vector<SelfCheckEntry> selfcheck_results(const GpuSettings& settings);
// Runs the check of each variant the device can run on a canonical problem (f32 and f16, head
// dim 64, prefill and decode shapes), as `attnops info --selfcheck` does; returns the results.
std::vector<SelfCheckEntry> run_selfchecks(const GpuSettings& settings);
// Forgets this process's results (tests).
void reset_selfchecks();

}  // namespace attnops::vulkan
