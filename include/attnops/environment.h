// The library's environment variables, read once per process (at the first call that needs them),
// not once per call: a serving loop makes thousands of small calls a second, and looking up and
// parsing four variables in each would cost more than a small call's kernel. A process that changes
// them after its first call (setenv; the tests do) calls reload_environment() for the change to
// take effect.
//
//   ATTNOPS_FORCE_NATIVE  1, true, yes (on) or 0, false, no, empty (off), any case; anything else
//                         makes every call fail with Error(invalid_argument) naming the variable
//   ATTNOPS_LOG           a comma list; `dispatch` or `all`: one stderr line per dispatch decision
//   ATTNOPS_PROFILE       anything but empty, 0 or false: every call records timings
//   ATTNOPS_CPU_ISA       a cap on the cpu backend's ISA tier (backends/cpu/isa.h)
// (The Vulkan backend's ATTNOPS_VK_* variables are read when a device or module is created.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace attnops {

struct EnvironmentSettings {
  bool force_native = false;
  std::string force_native_error;  // non-empty: ATTNOPS_FORCE_NATIVE's value is invalid (the message)
  bool log_dispatch = false;
  bool profile = false;
  std::optional<std::string> cpu_isa;  // ATTNOPS_CPU_ISA as set (unset: nullopt)

  // force_native, or Error(invalid_argument) naming the variable when its value is invalid.
  bool forced_native() const;
};

// The settings read at the first call (thread-safe; the reference stays valid for the process).
const EnvironmentSettings& environment();

// Reads the variables again; calls made after it see the new values.
void reload_environment();

}  // namespace attnops
