// The differential fuzzer's loop (`attnops verify --fuzz`, cli/cmd_verify.cpp): cases
// SEED:0, SEED:1, ... of each seed, round-robin over the seeds, until each seed has its
// problem count or the time budget is spent. Each case draws a dense problem (vanilla,
// blocksparse, flash_attn2, and ring / ulysses on its shards) and a paged one (ragged_paged)
// and runs them on every target (target.h); a mismatch is printed as one line the moment it is
// found, shrunk to a smaller failing case where cheap, and its inputs saved on request.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "verify/dense_problem.h"
#include "verify/outcome.h"
#include "verify/report.h"
#include "verify/shrink.h"
#include "verify/target.h"

namespace attnops::verify {

struct FuzzOptions {
  std::vector<std::uint64_t> seeds{1};
  std::optional<std::int64_t> problems;  // per seed; nullopt: until the time budget ends
  std::optional<double> seconds;         // wall-clock budget of the whole run
  TargetRequest request;
  Limits limits;
  std::int64_t gpu_max_work = std::int64_t{1} << 21;
  double repeat_fraction = 0.25;
  bool shrink = true;
  ShrinkBudget shrink_budget;
  // --replay SEED:CASE: that case alone, every call repeated for determinism; with `shape`, at
  // those sizes (a shrunk case).
  std::optional<std::pair<std::uint64_t, std::uint64_t>> replay;
  std::optional<Shape7> shape;
  std::string save_failures;  // directory; empty: do not save
  SaveNpy save_npy;           // how to write .npy files (the CLI's writer; it creates the directory)
  SaveText save_text;
  Registry* registry = nullptr;                        // nullptr: the process registry
  std::ostream* out = nullptr;                         // failure lines and progress; nullptr: none
  double progress_seconds = 30;                        // a progress line this often (0: never)
  std::function<void(const Target&, Tensor&)> tamper;  // RunSettings::tamper (tests)
};

struct FuzzFailure {
  std::uint64_t seed = 0, index = 0;
  Finding finding;
  std::string line;         // the one-line report
  std::string smallest;     // the shrunk case and its replay command, when shrinking found one
  std::string run_command;  // with --save-failures
};

struct FuzzSummary {
  std::vector<std::uint64_t> seeds;
  std::map<std::uint64_t, std::int64_t> problems_per_seed;
  std::int64_t problems = 0;
  double seconds = 0;
  Tally tally;
  std::vector<std::string> notes;  // targets left out and why
  std::vector<FuzzFailure> failures;
  bool time_budget_hit = false;
  // 0: no mismatch; 1: mismatches (the command-line exit status).
  int exit_status() const { return failures.empty() ? 0 : 1; }
};

FuzzSummary run_fuzz(const FuzzOptions& options);

}  // namespace attnops::verify
