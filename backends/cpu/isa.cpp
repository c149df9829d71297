// Detection of the CPU tier (CPUID, XCR0, Linux AMX permission) and the ATTNOPS_CPU_ISA cap.
// Baseline code: compiled without target flags, as everything outside the tier objects.
#include "backends/cpu/isa.h"

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "attnops/environment.h"
#include "attnops/error.h"
#include "attnops/ext/environment.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace attnops::cpu {
namespace {

constexpr std::array<std::string_view, kIsaCount> kNames = {"baseline", "avx2", "avx512", "avx512bf16",
                                                            "amx"};

#if defined(__x86_64__) || defined(__i386__)
std::uint64_t read_xcr0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (std::uint64_t{hi} << 32) | lo;
}

// Linux makes AMX tile data a dynamic xstate feature: the first tile instruction of a process
// that did not ask for it gets SIGILL. Ask once per process; confirm with ARCH_GET_XCOMP_PERM.
// Returns 0 or the errno of the failed request.
int request_amx_permission() {
#if defined(__linux__)
  constexpr long kGetPerm = 0x1022, kReqPerm = 0x1023;  // asm/prctl.h ARCH_{GET,REQ}_XCOMP_PERM
  constexpr long kXtileData = 18;                       // XFEATURE_XTILEDATA
  if (syscall(SYS_arch_prctl, kReqPerm, kXtileData) != 0) return errno != 0 ? errno : EPERM;
  unsigned long perm = 0;
  if (syscall(SYS_arch_prctl, kGetPerm, &perm) != 0) return errno != 0 ? errno : EPERM;
  return (perm >> kXtileData) & 1 ? 0 : EPERM;
#else
  return ENOSYS;
#endif
}

CpuFeatures probe() {
  CpuFeatures f;
  f.x86 = true;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.osxsave = (c >> 27) & 1;
  f.avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    const unsigned max_sub = a;
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = (a >> 5) & 1;
  }
  if (f.osxsave) f.xcr0 = read_xcr0();
  // Only a CPU and OS that could run AMX are asked for the permission (a syscall with effects).
  constexpr std::uint64_t kTileState = (std::uint64_t{1} << 17) | (std::uint64_t{1} << 18);
  if (f.amx_tile && f.amx_bf16 && (f.xcr0 & kTileState) == kTileState)
    f.amx_permission_errno = request_amx_permission();
  return f;
}
#else
CpuFeatures probe() {
  return CpuFeatures{};
}
#endif

std::string missing(std::initializer_list<std::pair<bool, const char*>> need) {
  std::string r;
  for (auto [have, name] : need)
    if (!have)
      r.append(r.empty() ? "" : "/").append(name);  // (no literal + string: GCC 12 -Wrestrict, bug 105651)
  return r;
}

}  // namespace

std::string_view isa_name(Isa isa) {
  return kNames[static_cast<std::size_t>(isa)];
}

std::optional<Isa> parse_isa(std::string_view s) {
  for (int i = 0; i < kIsaCount; ++i)
    if (kNames[static_cast<std::size_t>(i)] == s) return static_cast<Isa>(i);
  return std::nullopt;
}

std::string isa_names() {
  std::string r;
  for (std::string_view n : kNames) r.append(r.empty() ? "" : "|").append(n);
  return r;
}

bool isa_compiled(Isa isa) {
#if defined(ATTNOPS_CPU_BUILT_TIERS)
  return ((ATTNOPS_CPU_BUILT_TIERS >> static_cast<int>(isa)) & 1) != 0;
#else
  return isa == Isa::baseline;
#endif
}

namespace {

bool isa_x86_build() {
#if defined(ATTNOPS_CPU_X86_TIERS)
  return true;
#else
  return false;
#endif
}

// The best compiled tier at or below `isa` (the baseline always is).
Isa compiled_at_most(Isa isa) {
  while (isa != Isa::baseline && !isa_compiled(isa)) isa = static_cast<Isa>(static_cast<int>(isa) - 1);
  return isa;
}

// A CPU that runs tiers this build lacks (ATTNOPS_CPU_TIER_SET=host, built on a smaller CPU):
// the best compiled tier below, with the reason.
IsaDetection lower_to_compiled(IsaDetection d) {
  const Isa runs = d.best;
  d.best = compiled_at_most(runs);
  if (d.best != runs)
    d.refused = std::string(isa_name(static_cast<Isa>(static_cast<int>(d.best) + 1))) +
                " refused: not compiled into this build (ATTNOPS_CPU_TIER_SET=host); the CPU runs " +
                std::string(isa_name(runs));
  return d;
}

}  // namespace

IsaDetection decide_isa(const CpuFeatures& f) {
  IsaDetection r;
  r.cpu = f;
  auto refuse = [&](std::string why) {
    r.refused = std::string(isa_name(static_cast<Isa>(static_cast<int>(r.best) + 1))) + " refused: " + why;
    return r;
  };
  if (!f.x86 || !isa_x86_build()) return refuse("this build has only the baseline tier (not x86-64)");
  // AVX2 tier.
  if (std::string m = missing({{f.avx, "AVX"}, {f.avx2, "AVX2"}, {f.fma, "FMA"}, {f.f16c, "F16C"}});
      !m.empty())
    return refuse("CPU lacks " + m);
  if (!f.osxsave || (f.xcr0 & 0x6) != 0x6) return refuse("the OS does not enable AVX state (XCR0 bits 1-2)");
  r.best = Isa::avx2;
  // AVX-512 tier.
  if (std::string m = missing({{f.avx512f, "AVX512F"},
                               {f.avx512bw, "AVX512BW"},
                               {f.avx512dq, "AVX512DQ"},
                               {f.avx512vl, "AVX512VL"}});
      !m.empty())
    return refuse("CPU lacks " + m);
  if ((f.xcr0 & 0xE6) != 0xE6) return refuse("the OS does not enable opmask/ZMM state (XCR0 bits 5-7)");
  r.best = Isa::avx512;
  if (!f.avx512bf16) return refuse("CPU lacks AVX512_BF16");
  r.best = Isa::avx512bf16;
  // AMX tier: CPU, OS state, then the per-process permission.
  if (std::string m = missing({{f.amx_tile, "AMX-TILE"}, {f.amx_bf16, "AMX-BF16"}}); !m.empty())
    return refuse("CPU lacks " + m);
  constexpr std::uint64_t kTileState = (std::uint64_t{1} << 17) | (std::uint64_t{1} << 18);
  if ((f.xcr0 & kTileState) != kTileState)
    return refuse("the OS does not enable tile state (XCR0 bits 17-18)");
  if (f.amx_permission_errno != 0)
    return refuse("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: " +
                  std::string(std::strerror(f.amx_permission_errno)));
  r.best = Isa::amx;
  return r;
}

std::string CpuFeatures::summary() const {
  std::string s;
  for (auto [on, n] : {std::pair{avx2, "avx2"},
                       {fma, "fma"},
                       {f16c, "f16c"},
                       {avx512f, "avx512f"},
                       {avx512bw, "avx512bw"},
                       {avx512dq, "avx512dq"},
                       {avx512vl, "avx512vl"},
                       {avx512bf16, "avx512bf16"},
                       {amx_tile, "amx-tile"},
                       {amx_bf16, "amx-bf16"}})
    if (on) s.append(s.empty() ? "" : " ").append(n);
  return s;
}

const IsaDetection& detect_isa() {
  static const IsaDetection d = lower_to_compiled(decide_isa(probe()));  // thread-safe, once per process
  return d;
}

IsaChoice choose_isa_capped(std::optional<Isa> cap) {
  const IsaDetection& d = detect_isa();
  IsaChoice c;
  c.detected = d.best;
  c.cap = cap;
  c.tier = compiled_at_most(cap && *cap < d.best ? *cap : d.best);
  c.detail = "detected " + std::string(isa_name(d.best));
  if (!d.refused.empty()) c.detail += " (" + d.refused + ")";
  if (cap) {
    c.detail += *cap < d.best ? "; capped by " : "; cap ";
    c.detail += std::string(kIsaCapEnv) + "=" + std::string(isa_name(*cap));
    if (*cap > d.best) c.detail += " is above what this CPU runs, ignored";
  }
  return c;
}

IsaChoice choose_isa() {
  const std::optional<std::string>& set = environment().cpu_isa;  // read once (attnops/environment.h)
  if (!set || set->empty()) return choose_isa_capped(std::nullopt);
  const char* env = set->c_str();
  const std::optional<Isa> cap = parse_isa(env);
  if (cap) return choose_isa_capped(cap);
  IsaChoice c = choose_isa_capped(std::nullopt);
  const std::string note = std::string(kIsaCapEnv) + "=" + env + " ignored: expected one of " + isa_names();
  static std::once_flag warned;  // a typo is visible once on stderr and in every decision's detail
  std::call_once(warned, [&] { std::fprintf(stderr, "attnops: warning: %s\n", note.c_str()); });
  c.detail += "; " + note;
  return c;
}

IsaChoice choose_isa_forced(Isa forced) {
  IsaChoice c = choose_isa_capped(forced);
  if (c.tier != forced || !isa_compiled(forced))
    throw Error(ErrorCode::backend_unavailable, "cpu tier " + std::string(isa_name(forced)) +
                                                    " requested, but this CPU and build run at most " +
                                                    std::string(isa_name(c.detected)) + " (" + c.detail +
                                                    ")");
  c.detail += "; tier " + std::string(isa_name(forced)) + " forced by the caller";
  return c;
}

const IsaChoice& current_isa_choice() {
  // Made again only when the environment is re-read (reload_environment()): no lookup per call.
  struct Cached {
    std::uint64_t generation = 0;  // of the environment the choice was made for (0: none yet)
    IsaChoice choice;
  };
  thread_local Cached cached;
  const std::uint64_t g = environment_generation();
  if (cached.generation != g) {
    cached.choice = choose_isa();
    cached.generation = g;
  }
  return cached.choice;
}

}  // namespace attnops::cpu
