// Float controls added to SPIR-V modules (vk_spirv.h). The layout of a module (SPIR-V 1.6 spec,
// 2.4 "Logical Layout of a Module"): a 5-word header, then OpCapability*, OpExtension*,
// OpExtInstImport*, OpMemoryModel, OpEntryPoint*, OpExecutionMode*, ... Each instruction's first
// word is (word count << 16) | opcode.
#include "backends/vulkan/vk_spirv.h"

#include <algorithm>
#include <cstring>

namespace attnops::vulkan::rt {

namespace {

constexpr std::uint32_t kMagic = 0x07230203;
constexpr std::uint32_t kOpExtension = 10, kOpEntryPoint = 15, kOpExecutionMode = 16, kOpCapability = 17;
constexpr std::uint32_t kCapFloat16 = 9, kCapDenormPreserve = 4464, kCapDenormFlushToZero = 4465,
                        kCapSignedZeroInfNanPreserve = 4466, kCapRoundingModeRTE = 4467,
                        kCapRoundingModeRTZ = 4468;
constexpr std::uint32_t kModeSignedZeroInfNanPreserve = 4461, kModeRoundingModeRTE = 4462;

std::uint32_t op_word(std::uint32_t length, std::uint32_t opcode) {
  return length << 16 | opcode;
}

// "SPV_KHR_float_controls" as a SPIR-V literal string: nul-terminated, padded to whole words.
std::vector<std::uint32_t> literal(const char* s) {
  const std::size_t n = std::strlen(s) + 1;
  std::vector<std::uint32_t> w((n + 3) / 4, 0u);
  std::memcpy(w.data(), s, n);
  return w;
}

}  // namespace

std::vector<SpirvInstruction> spirv_instructions(const std::uint32_t* words, std::size_t count) {
  std::vector<SpirvInstruction> out;
  if (count < 5 || words[0] != kMagic) return out;
  for (std::size_t at = 5; at < count;) {
    const std::uint32_t length = words[at] >> 16, opcode = words[at] & 0xffffu;
    if (length == 0 || at + length > count) return {};  // malformed
    out.push_back({opcode, static_cast<std::uint32_t>(at), length});
    at += length;
  }
  return out;
}

std::vector<std::uint32_t> with_float_controls(const std::uint32_t* words, std::size_t count,
                                               const FloatControls& fc, std::string* declared) {
  std::vector<std::uint32_t> original(words, words + count);
  if (declared != nullptr) declared->clear();
  const std::vector<SpirvInstruction> ins = spirv_instructions(words, count);
  if (ins.empty() || !fc.any()) return original;

  bool float16 = false;
  std::vector<std::uint32_t> entry_points;
  std::size_t last_capability = 0, last_entry = 0;  // indices into ins (+1: 0 = none)
  for (std::size_t i = 0; i < ins.size(); ++i) {
    const SpirvInstruction& x = ins[i];
    if (x.opcode == kOpCapability && x.length == 2) {
      const std::uint32_t cap = words[x.offset + 1];
      if (cap == kCapFloat16) float16 = true;
      if (cap == kCapDenormPreserve || cap == kCapDenormFlushToZero || cap == kCapSignedZeroInfNanPreserve ||
          cap == kCapRoundingModeRTE || cap == kCapRoundingModeRTZ)
        return original;  // already declares float controls: leave it alone
      last_capability = i + 1;
    }
    if (x.opcode == kOpEntryPoint && x.length >= 3) {
      entry_points.push_back(words[x.offset + 2]);
      last_entry = i + 1;
    }
  }
  if (last_capability == 0 || last_entry == 0) return original;

  // What applies to this module.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> modes;  // (execution mode, width)
  std::vector<std::uint32_t> caps;
  if (fc.signed_zero_inf_nan_32) modes.push_back({kModeSignedZeroInfNanPreserve, 32});
  if (float16 && fc.signed_zero_inf_nan_16) modes.push_back({kModeSignedZeroInfNanPreserve, 16});
  if (!modes.empty()) caps.push_back(kCapSignedZeroInfNanPreserve);
  // Rounding of f32 -> f16 conversions: RTE for 16 bits; where the device ties every width's
  // rounding mode together, 32 bits must say the same.
  if (float16 && fc.rte_16 && (fc.rounding_independent || fc.rte_32)) {
    modes.push_back({kModeRoundingModeRTE, 16});
    if (!fc.rounding_independent) modes.push_back({kModeRoundingModeRTE, 32});
    caps.push_back(kCapRoundingModeRTE);
  }
  if (modes.empty()) return original;

  const std::uint32_t version = words[1];
  const bool need_extension = version < 0x00010400u;  // float controls are core in SPIR-V 1.4
  std::vector<std::uint32_t> out(words, words + 5);
  out.reserve(count + 2 * caps.size() + 4 * modes.size() * entry_points.size() + 8);
  for (std::uint32_t cap : caps) out.insert(out.end(), {op_word(2, kOpCapability), cap});
  for (std::size_t i = 0; i < ins.size(); ++i) {
    const SpirvInstruction& x = ins[i];
    out.insert(out.end(), words + x.offset, words + x.offset + x.length);
    if (i + 1 == last_capability && need_extension) {
      const std::vector<std::uint32_t> name = literal("SPV_KHR_float_controls");
      out.push_back(op_word(static_cast<std::uint32_t>(1 + name.size()), kOpExtension));
      out.insert(out.end(), name.begin(), name.end());
    }
    if (i + 1 == last_entry)
      for (std::uint32_t ep : entry_points)
        for (const auto& [mode, width] : modes)
          out.insert(out.end(), {op_word(4, kOpExecutionMode), ep, mode, width});
  }
  if (declared != nullptr)
    for (const auto& [mode, width] : modes)
      *declared +=
          std::string(declared->empty() ? "" : ", ") +
          (mode == kModeSignedZeroInfNanPreserve ? "SignedZeroInfNanPreserve " : "RoundingModeRTE ") +
          std::to_string(width);
  return out;
}

}  // namespace attnops::vulkan::rt
