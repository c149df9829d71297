// What running a case produces: the mismatches found (each tied to its target), and the counts
// the summary reports (calls per target, checks, skips and their reasons).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attnops/error.h"
#include "attnops/registry.h"
#include "verify/compare.h"
#include "verify/target.h"

namespace attnops::verify {

struct Finding {
  Target target;
  Mismatch mismatch;
  std::string problem;  // the case as drawn (shapes and options), or the paged / distributed one
};

struct Tally {
  std::int64_t calls = 0;   // library calls checked (forward, backward, paged, distributed)
  std::int64_t checks = 0;  // comparisons made (oracle, determinism, thread counts, batch invariance)
  std::map<std::string, std::int64_t> calls_by_target;  // Target::text() without threads -> calls
  std::map<std::string, std::int64_t> skipped;          // why a target did not run a case -> count
  void skip(const std::string& why) { ++skipped[why]; }
  void merge(const Tally& o);
};

// How the runners call and check.
struct RunSettings {
  const Registry* registry = nullptr;
  double repeat_fraction = 0.25;                      // share of calls repeated for call-to-call determinism
  std::int64_t gpu_max_work = std::int64_t{1} << 21;  // larger problems skip the gpu (lavapipe is slow)
  // A test hook: applied to every result the fuzzer receives before it is checked (the library is
  // not involved), so tests can prove that a wrong result is reported. Empty: none.
  std::function<void(const Target&, Tensor&)> tamper;
};

// The outcome of an attnops::Error from a call that was forced onto one backend: a skip (the
// backend does not support these inputs: unsupported_feature / dtype, not_implemented,
// selftest_failed) or a finding (anything else, a gpu_error included).
std::optional<std::string> skip_reason(const Error& e);

// Whether decision `d` ran on the target's backend and ISA tier (cpu) or names the forced gpu
// variant; nullopt when it did, else the mismatch. A forced variant the device cannot run is not a
// mismatch: `variant_refused` is set and the call counts as skipped.
// `empty`: the problem has no work (Tq, Tk or B is 0): no kernel runs, so none is named.
std::optional<Mismatch> check_decision(const Target& t, const DispatchDecision& d, const std::string& op_ran,
                                       bool* variant_refused, bool empty = false);

}  // namespace attnops::verify
