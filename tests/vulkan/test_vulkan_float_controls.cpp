// Float controls (vk_spirv.h, README "Float controls"): every embedded shader gets
// SignedZeroInfNanPreserve for the widths it uses where the device supports them (and RTE
// rounding for 16-bit conversions), inserted where SPIR-V's logical layout wants them; the
// patched modules pass spirv-val (every shader, the cooperative-matrix ones lavapipe cannot run
// included) and the validation layer (the ones lavapipe runs: every other Vulkan test); a device
// without float controls gets the module unchanged; the decision says what was declared.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attnops/ext/problem.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

#if ATTNOPS_TEST_VULKAN_BUILT
#include "backends/vulkan/vk_shader_table.h"
#include "backends/vulkan/vk_spirv.h"

namespace attnops::testing {
namespace {

using vulkan::rt::FloatControls;
using vulkan::rt::ShaderBlob;
using vulkan::rt::ShaderId;
using vulkan::rt::spirv_instructions;
using vulkan::rt::with_float_controls;

constexpr std::uint32_t kOpExtension = 10, kOpEntryPoint = 15, kOpExecutionMode = 16, kOpCapability = 17,
                        kOpName = 5, kOpDecorate = 71;
constexpr std::uint32_t kCapFloat16 = 9, kCapSignedZero = 4466, kCapRte = 4467;
constexpr std::uint32_t kModeSignedZero = 4461, kModeRte = 4462;

FloatControls everything() {
  FloatControls fc;
  fc.signed_zero_inf_nan_16 = fc.signed_zero_inf_nan_32 = fc.rte_16 = fc.rte_32 = true;
  return fc;
}

std::vector<ShaderId> compiled_shaders() {
  std::vector<ShaderId> ids;
  for (std::uint32_t i = 0; i < static_cast<std::uint32_t>(ShaderId::count_); ++i)
    if (vulkan::rt::shader_blob(static_cast<ShaderId>(i)).words > 0) ids.push_back(static_cast<ShaderId>(i));
  return ids;
}

struct Summary {
  int capability_signed_zero = 0, capability_rte = 0, extensions = 0;
  bool float16 = false;
  std::vector<std::uint32_t> entry_points;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> modes;  // (mode, width) of float controls
  bool layout_ok = true;                                       // exec modes before names / decorations
};

Summary summarise(const std::vector<std::uint32_t>& w) {
  Summary s;
  bool seen_debug = false;
  for (const auto& x : spirv_instructions(w.data(), w.size())) {
    if (x.opcode == kOpCapability) {
      s.capability_signed_zero += w[x.offset + 1] == kCapSignedZero;
      s.capability_rte += w[x.offset + 1] == kCapRte;
      s.float16 = s.float16 || w[x.offset + 1] == kCapFloat16;
      s.layout_ok = s.layout_ok && !seen_debug;
    }
    if (x.opcode == kOpExtension) ++s.extensions;
    if (x.opcode == kOpEntryPoint) s.entry_points.push_back(w[x.offset + 2]);
    if (x.opcode == kOpExecutionMode) {
      const std::uint32_t mode = w[x.offset + 2];
      if (mode == kModeSignedZero || mode == kModeRte) s.modes.push_back({mode, w[x.offset + 3]});
      s.layout_ok = s.layout_ok && !seen_debug && !s.entry_points.empty();
    }
    if (x.opcode == kOpName || x.opcode == kOpDecorate) seen_debug = true;
  }
  return s;
}

bool has_mode(const Summary& s, std::uint32_t mode, std::uint32_t width) {
  for (const auto& m : s.modes)
    if (m.first == mode && m.second == width) return true;
  return false;
}

// spirv-val's verdict on a module ("" when valid, or when spirv-val is not installed: skipped).
std::string spirv_val(const std::vector<std::uint32_t>& words, const std::string& name) {
  if (std::system("command -v spirv-val > /dev/null 2>&1") != 0) return "";
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("attnops_fc_" + std::to_string(::getpid()) + "_" + name + ".spv"))
                               .string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(words.data()), static_cast<std::streamsize>(words.size() * 4));
  const std::string log = path + ".log";
  const int rc = std::system(("spirv-val --target-env vulkan1.2 " + path + " > " + log + " 2>&1").c_str());
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  std::filesystem::remove(log);
  return rc == 0 ? "" : text.empty() ? "spirv-val failed" : text;
}

TEST(VulkanFloatControls, EveryShaderGetsTheModesItsWidthsNeed) {
  const std::vector<ShaderId> ids = compiled_shaders();
  ASSERT_GE(ids.size(), 10u);
  for (ShaderId id : ids) {
    const ShaderBlob& blob = vulkan::rt::shader_blob(id);
    SCOPED_TRACE(blob.name);
    std::string declared;
    const std::vector<std::uint32_t> out =
        with_float_controls(blob.code, blob.words, everything(), &declared);
    const Summary s = summarise(out);
    ASSERT_FALSE(s.entry_points.empty());
    EXPECT_TRUE(s.layout_ok);
    EXPECT_EQ(s.capability_signed_zero, 1);
    EXPECT_EQ(s.extensions, summarise({blob.code, blob.code + blob.words}).extensions);  // SPIR-V 1.5: core
    EXPECT_TRUE(has_mode(s, kModeSignedZero, 32));
    EXPECT_EQ(has_mode(s, kModeSignedZero, 16), s.float16);
    EXPECT_EQ(has_mode(s, kModeRte, 16), s.float16);  // f32 -> f16 conversions of the coopmat kernels
    EXPECT_EQ(s.capability_rte, s.float16 ? 1 : 0);
    EXPECT_NE(declared.find("SignedZeroInfNanPreserve 32"), std::string::npos) << declared;
    EXPECT_EQ(spirv_val(out, blob.name), "");
    // Patching twice changes nothing more; no support, no change.
    EXPECT_EQ(with_float_controls(out.data(), out.size(), everything()), out);
    EXPECT_EQ(with_float_controls(blob.code, blob.words, FloatControls{}),
              std::vector<std::uint32_t>(blob.code, blob.code + blob.words));
  }
}

TEST(VulkanFloatControls, OnlyWhatTheDeviceSupports) {
  const ShaderBlob& blob = vulkan::rt::shader_blob(ShaderId::flash_tiled);
  FloatControls only16;
  only16.signed_zero_inf_nan_16 = true;  // no Float16 in flash_tiled: nothing applies
  std::string declared = "x";
  EXPECT_EQ(with_float_controls(blob.code, blob.words, only16, &declared),
            std::vector<std::uint32_t>(blob.code, blob.code + blob.words));
  EXPECT_EQ(declared, "");
  // A device that ties the rounding modes of all widths gets RTE 32 with RTE 16 (coopmat).
  const ShaderBlob& coop = vulkan::rt::shader_blob(ShaderId::flash_coopmat_nv);
  if (coop.words > 0) {
    FloatControls tied = everything();
    tied.rounding_independent = false;
    const Summary s = summarise(with_float_controls(coop.code, coop.words, tied));
    EXPECT_TRUE(has_mode(s, kModeRte, 16));
    EXPECT_TRUE(has_mode(s, kModeRte, 32));
    tied.rte_32 = false;  // cannot match the widths: no rounding mode declared at all
    const Summary t = summarise(with_float_controls(coop.code, coop.words, tied));
    EXPECT_FALSE(has_mode(t, kModeRte, 16));
    EXPECT_TRUE(has_mode(t, kModeSignedZero, 16));
  }
}

TEST(VulkanFloatControls, SpirvBefore14GetsTheExtension) {
  const ShaderBlob& blob = vulkan::rt::shader_blob(ShaderId::convert);
  std::vector<std::uint32_t> old(blob.code, blob.code + blob.words);
  old[1] = 0x00010300;  // claim SPIR-V 1.3
  const std::vector<std::uint32_t> out = with_float_controls(old.data(), old.size(), everything());
  EXPECT_EQ(summarise(out).extensions, summarise(old).extensions + 1);
  // Not SPIR-V at all: unchanged.
  std::vector<std::uint32_t> junk(20, 7u);
  EXPECT_EQ(with_float_controls(junk.data(), junk.size(), everything()), junk);
}

using VulkanFloatControlsOnDevice = VulkanTest;

// On lavapipe (which supports them) the attention kernels run with SignedZeroInfNanPreserve 32,
// and the decision says so; ATTNOPS_VK_FLOAT_CONTROLS=0 (read when modules are created) turns it
// off for comparison.
TEST_F(VulkanFloatControlsOnDevice, TheDecisionNamesTheDeclaredModes) {
  Case c = make_case(Spec().shape(1, 20, 20).heads(2, 1).dim(8), 4);
  const AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));
  EXPECT_NE(b.run.kernel_detail.find("float controls: SignedZeroInfNanPreserve 32"), std::string::npos)
      << b.run.kernel_detail;
  vulkan::release();
  setenv("ATTNOPS_VK_FLOAT_CONTROLS", "0", 1);
  AttentionBuffers off = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), off);
  unsetenv("ATTNOPS_VK_FLOAT_CONTROLS");
  vulkan::release();
  EXPECT_TRUE(within_tolerance(p, off));
  EXPECT_NE(off.run.kernel_detail.find("float controls: none"), std::string::npos) << off.run.kernel_detail;
}

}  // namespace
}  // namespace attnops::testing
#endif
