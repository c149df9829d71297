// `attnops demo`: every registered operator on generated inputs, for shapes chosen so that each
// operator-level fallback happens once (decode, non_causal, seq_multiple), printing the decision,
// the time (after a warm-up, the median of several calls: benchkit/median_timer.h) and the max error
// against the fp64 oracle.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "benchkit/median_timer.h"
#include "cli/commands.h"
#include "cli/decision_text.h"
#include "cli/inputs.h"
#include "cli/settings.h"
#include "cli/verify.h"

namespace attnops::cli {

using namespace benchkit;  // the benchmark harness's specs, timers and yardsticks
namespace {

struct DemoArgs {
  std::string config, backend, dtype = "f32";
};

struct DemoShape {
  const char* label;  // what the shape is for
  std::int64_t B, Tq, Tk, Hq, Hkv, D;
  bool causal;
};

// Small enough that the fp64 oracle checks every case in well under a second each.
constexpr DemoShape kShapes[] = {
    {"prefill (no fallback)", 1, 256, 256, 8, 2, 64, true},
    {"decode (Tq=1)", 2, 1, 300, 8, 2, 64, true},
    {"non-causal", 1, 256, 256, 8, 2, 64, false},
    {"Tq % 128 != 0", 1, 200, 200, 8, 2, 64, true},
};

int demo(const DemoArgs& a) {
  CallSettings settings;
  if (!a.backend.empty()) settings.backends = parse_backend_list(a.backend);
  settings.runtime_dtype = parse_dtype(a.dtype);
  const Config config = load_optional_config(a.config);
  const DType dtype = *settings.runtime_dtype;

  char line[512];
  std::snprintf(line, sizeof line, "%-12s %-22s %-24s %-12s %-7s %10s %5s %10s  %s\n", "requested", "case",
                "shape B,Tq,Tk,Hq,Hkv,D", "ran", "backend", "median_ms", "calls", "max_err", "reasons");
  std::cout << line;
  std::uint64_t seed = 1;
  for (const std::string& name : registry().list()) {
    const Attention attn = registry().get(name, config);
    for (const DemoShape& s : kShapes) {
      const auto [q, k, v] = random_qkv(s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, dtype, seed);
      seed += 3;
      AttentionOptions opts;
      opts.causal = s.causal;
      set_call_settings(opts, settings);
      // A warm-up call (thread pool, block maps), then the median of 5 to 25 calls (as many as
      // fit in 200 ms): one call would show the scheduler's time slices on a busy machine.
      AttentionOutput r;
      const CallTimes t = median_call_time([&] { r = attn(q, k, v, opts); });
      // The oracle sees the metadata of the operator that actually ran (vanilla after a fallback).
      const OperationMetadata& md = metadata_that_ran(attn, r.decision);
      const double err = max_error_vs_oracle(q, k, v, opts, md, r.out);
      const std::string shape = std::to_string(s.B) + "," + std::to_string(s.Tq) + "," +
                                std::to_string(s.Tk) + "," + std::to_string(s.Hq) + "," +
                                std::to_string(s.Hkv) + "," + std::to_string(s.D);
      std::snprintf(line, sizeof line, "%-12s %-22s %-24s %-12s %-7s %10.3f %5d %10.2e  %s\n", name.c_str(),
                    s.label, shape.c_str(), r.decision.op.c_str(),
                    std::string(backend_name(r.decision.backend)).c_str(), t.median_ms, t.calls, err,
                    (reason_codes(r.decision).empty() ? std::string("-") : reason_codes(r.decision)).c_str());
      std::cout << line << std::flush;
    }
  }
  return std::cout ? 0 : 2;
}

}  // namespace

Command add_demo_command(CLI::App& root) {
  auto a = std::make_shared<DemoArgs>();
  CLI::App* app =
      root.add_subcommand("demo", "Run every operator on generated inputs; show decisions and errors");
  app->add_option("--config", a->config, "YAML configuration (default: none, the built-in defaults)");
  app->add_option("--backend", a->backend, "Backend to try first (auto, native, cpu, gpu, tpu or a list)");
  app->add_option("--dtype", a->dtype, "Input and runtime dtype")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  return {app, [a] { return demo(*a); }};
}

}  // namespace attnops::cli
