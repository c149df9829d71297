// Float controls for the embedded shaders (README "Float controls"). Vulkan lets a driver assume
// that no float is NaN or +-inf unless the entry point declares SignedZeroInfNanPreserve, and the
// library's non-finite policy needs NaN and infinities to behave as IEEE says. glslc (Debian 12's
// glslang) cannot declare execution modes, and a module that declares one the device lacks is
// invalid, so the runtime adds them to each module's words when it creates the shader module, for
// the widths the device supports (VkPhysicalDeviceFloatControlsProperties):
//   SignedZeroInfNanPreserve 32 (and 16 in modules with Float16 arithmetic: the cooperative-matrix
//   kernels), RoundingModeRTE 16 (and 32 where the device ties the rounding modes of all widths)
//   in modules with Float16 arithmetic, so that f32 -> f16 conversions round to nearest even.
// Pure functions on SPIR-V words; no Vulkan calls. Internal to backends/vulkan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace attnops::vulkan::rt {

// What the device allows (VkPhysicalDeviceFloatControlsProperties, Vulkan 1.2).
struct FloatControls {
  bool signed_zero_inf_nan_16 = false, signed_zero_inf_nan_32 = false;
  bool rte_16 = false, rte_32 = false;
  bool rounding_independent = true;  // roundingModeIndependence != NONE
  bool any() const { return signed_zero_inf_nan_16 || signed_zero_inf_nan_32 || rte_16 || rte_32; }
};

// The module `words` with the float-control capabilities and execution modes of `fc` that apply to
// it declared for every entry point (and OpExtension SPV_KHR_float_controls before SPIR-V 1.4).
// `declared` (if not null) receives what was added, e.g. "SignedZeroInfNanPreserve 32", empty when
// nothing applied. A module that is not SPIR-V, or already declares float controls, is returned
// unchanged.
std::vector<std::uint32_t> with_float_controls(const std::uint32_t* words, std::size_t count,
                                               const FloatControls& fc, std::string* declared = nullptr);

// Instructions of a module (for tests and the patcher): opcode and the word offset.
struct SpirvInstruction {
  std::uint32_t opcode = 0, offset = 0, length = 0;
};
std::vector<SpirvInstruction> spirv_instructions(const std::uint32_t* words, std::size_t count);

}  // namespace attnops::vulkan::rt
