// Instruction-set tiers of the CPU kernels and the run-time choice among them.
//
// The CPU kernels are compiled once per tier from the same sources, each tier with its own
// target flags (backends/cpu/README.md, backends/cpu/tiers.cmake). At run time the highest tier
// that the CPU and the OS support is chosen (CPUID, XCR0, and for AMX the Linux permission
// arch_prctl(ARCH_REQ_XCOMP_PERM)), capped by ATTNOPS_CPU_ISA for tests and reproducibility. The
// cap never raises the tier above what was detected.
//
// This file and isa.cpp are baseline code (no target flags): they run before any tier is known.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace attnops::cpu {

// Lowest first; a tier may use every instruction of the tiers below it.
//   baseline    x86-64 (SSE2), or the target's default on other architectures
//   avx2        AVX2 + FMA + F16C
//   avx512      AVX-512 F/BW/DQ/VL
//   avx512bf16  + AVX-512 BF16 (VDPBF16PS: bf16 q.k and p.v)
//   amx         + AMX-TILE, AMX-BF16 (TDPBF16PS tiles for bf16 inputs)
enum class Isa : int { baseline = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3, amx = 4 };
inline constexpr int kIsaCount = 5;

std::string_view isa_name(Isa isa);                // "baseline", "avx2", ...
std::optional<Isa> parse_isa(std::string_view s);  // the names above, exactly
std::string isa_names();                           // "baseline|avx2|avx512|avx512bf16|amx"

// What CPUID, XGETBV and the OS report (the input of the decision; tests build their own).
struct CpuFeatures {
  bool x86 = false;
  bool osxsave = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
  std::uint64_t xcr0 = 0;  // XCR0: the register state the OS saves (bits 1-2 AVX, 5-7 AVX-512, 17-18 AMX)
  int amx_permission_errno = -1;  // arch_prctl(ARCH_REQ_XCOMP_PERM): 0 granted, errno, -1 not asked
  std::string summary() const;    // "avx2 fma f16c avx512f ..."
};

// What this process may run, probed once (thread-safe) on first use.
struct IsaDetection {
  Isa best = Isa::baseline;  // the highest tier the CPU, the OS and this build support
  std::string refused;       // why the tier above `best` was refused ("" at the top)
  CpuFeatures cpu;           // what was probed (cpu.summary(): "avx2 fma f16c avx512f ...")
};
const IsaDetection& detect_isa();
// The decision itself, from given features (detect_isa() applies it to the probed ones).
IsaDetection decide_isa(const CpuFeatures& f);

// Whether this build contains the kernels of `isa` (all five on x86-64, baseline elsewhere).
bool isa_compiled(Isa isa);

// The tier the kernels run now: the detected one, lowered to `cap` if given. The name of the
// environment variable that provides the cap in production.
inline constexpr const char* kIsaCapEnv = "ATTNOPS_CPU_ISA";
struct IsaChoice {
  Isa tier = Isa::baseline;  // the tier that runs
  Isa detected = Isa::baseline;
  std::optional<Isa> cap;
  // Why this tier, for RunInfo::kernel_detail and `attnops info`, e.g.
  // "detected avx512bf16 (amx refused: CPU lacks AMX-TILE/AMX-BF16); capped by ATTNOPS_CPU_ISA=avx2"
  std::string detail;
};
// From ATTNOPS_CPU_ISA as the environment snapshot holds it (an unknown value is ignored and named
// in the detail).
IsaChoice choose_isa();
// choose_isa() for the kernel calls: the same choice, kept per thread and rebuilt only when the
// environment is re-read (attnops/environment.h: ATTNOPS_CPU_ISA is read once per process, and
// again after reload_environment()); a call looks nothing up and copies nothing.
const IsaChoice& current_isa_choice();
// With an explicit cap instead of the environment (tests; nullopt = no cap).
IsaChoice choose_isa_capped(std::optional<Isa> cap);
// Exactly the tier `forced` (the kernel tests' explicit tier), its detail saying so;
// Error(backend_unavailable) when this CPU does not run it or this build does not hold it.
IsaChoice choose_isa_forced(Isa forced);

struct TierKernels;
// The tier a kernel test names for a call: one of this build's (by Isa), or a kernel table of the
// test's own, which then runs in place of the build's (the tier's kernels built again with
// emulated instructions, tests/tiers; tier_kernels.h).
struct ForcedTier {
  Isa isa;
  const TierKernels* table = nullptr;
  ForcedTier(Isa i) : isa(i) {}  // implicit: a tier of this build
  explicit ForcedTier(const TierKernels& kernels);
};
// choose_isa_forced for a ForcedTier: a given table's choice names its tier (and emulation);
// Error(backend_unavailable) when this CPU cannot run it.
IsaChoice choose_forced_tier(const ForcedTier& forced);

}  // namespace attnops::cpu
