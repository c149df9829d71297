// `attnops verify`: the differential fuzzer (verify/fuzz.h) from the command line. Exit status
// 0 when no mismatch was found, 1 when one was (each printed as one line with its replay
// command), 2 for a usage error or bad input, as every command.
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "cli/commands.h"
#include "cli/npy.h"
#include "cli/output_set.h"
#include "verify/fuzz.h"

namespace attnops::cli {
namespace {

struct VerifyArgs {
  bool fuzz = false;
  std::vector<std::string> seeds;
  std::int64_t problems = 0;
  double seconds = 0;
  std::string ops = "all", passes = "forward,backward", backends = "cpu", tiers = "all", threads,
              gpu_kernels = "all";
  std::int64_t work = std::int64_t{1} << 26, max_seq = 4096, gpu_work = std::int64_t{1} << 21;
  bool no_nonfinite = false, no_shrink = false;
  double repeat_fraction = 0.25, progress = 30;
  std::string save_failures, replay, shape, json, head_dims;
  CLI::Option *problems_opt = nullptr, *seconds_opt = nullptr;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Error usage(const std::string& what) {
  return Error(ErrorCode::invalid_argument, what);
}

std::uint64_t parse_u64(const std::string& s, const std::string& what) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty() || s[0] == '-')
    throw usage(what + ": expected a non-negative integer, got '" + s + "'");
  return v;
}

// --seed 3 --seed 1,2 --seed 10..12: each a number, a comma list or an inclusive range.
std::vector<std::uint64_t> parse_seeds(const std::vector<std::string>& given) {
  std::vector<std::uint64_t> seeds;
  for (const std::string& g : given)
    for (const std::string& item : split(g)) {
      const auto dots = item.find("..");
      if (dots == std::string::npos) {
        seeds.push_back(parse_u64(item, "--seed"));
        continue;
      }
      const std::uint64_t a = parse_u64(item.substr(0, dots), "--seed"),
                          b = parse_u64(item.substr(dots + 2), "--seed");
      if (b < a || b - a > 100000) throw usage("--seed: range '" + item + "' is empty or longer than 100000");
      for (std::uint64_t s = a; s <= b; ++s) seeds.push_back(s);
    }
  if (seeds.empty()) seeds.push_back(1);
  return seeds;
}

verify::FuzzOptions options_from(const VerifyArgs& a) {
  verify::FuzzOptions o;
  o.seeds = parse_seeds(a.seeds);
  if (a.problems_opt->count()) o.problems = a.problems;
  if (a.seconds_opt->count()) o.seconds = a.seconds;
  verify::TargetRequest& r = o.request;
  if (a.ops == "all") {
    for (const char* op : verify::kAllOps) r.ops.push_back(op);
  } else {
    for (const std::string& op : split(a.ops)) {
      const std::string name = op == "ring" || op == "ulysses" ? op : registry().canonical(op);
      r.ops.push_back(name);
    }
  }
  for (const std::string& p : split(a.passes)) {
    if (p == "forward")
      r.passes.push_back(Pass::forward);
    else if (p == "backward")
      r.passes.push_back(Pass::backward);
    else
      throw usage("--passes: expected forward and/or backward, got '" + p + "'");
  }
  for (const std::string& b : split(a.backends)) {
    const auto be = parse_backend(b);
    if (!be || *be == Backend::tpu) throw usage("--backends: expected cpu, gpu or native, got '" + b + "'");
    r.backends.push_back(*be);
  }
  for (const std::string& t : split(a.tiers)) {
    bool known = t == "all";
    for (const char* k : verify::kTiers) known = known || t == k;
    if (!known)
      throw usage("--tiers: unknown tier '" + t + "' (all, baseline, avx2, avx512, avx512bf16, amx)");
    r.tiers.push_back(t);
  }
  for (const std::string& k : split(a.gpu_kernels)) {
    bool known = k == "all";
    for (const char* v : verify::kGpuKernels) known = known || k == v;
    if (!known) throw usage("--gpu-kernels: unknown variant '" + k + "'");
    r.gpu_kernels.push_back(k);
  }
  if (a.threads.empty()) {
    r.threads = {1, 2, 3, max_worker_threads() + 1};
  } else {
    for (const std::string& t : split(a.threads)) {
      const std::uint64_t n = parse_u64(t, "--threads");
      if (n < 1 || n > 1024) throw usage("--threads: expected 1 to 1024, got " + t);
      r.threads.push_back(static_cast<int>(n));
    }
  }
  if (r.ops.empty() || r.passes.empty() || r.backends.empty() || r.threads.empty())
    throw usage("--ops, --passes, --backends and --threads must each name at least one");
  if (a.work < 1 || a.max_seq < 1 || a.gpu_work < 0)
    throw usage("--work, --max-seq: expected positive sizes");
  o.limits.max_work = a.work;
  o.limits.max_seq = a.max_seq;
  o.limits.nonfinite = !a.no_nonfinite;
  for (const std::string& d : split(a.head_dims)) {
    const std::uint64_t n = parse_u64(d, "--head-dims");
    if (n < 1 || n > 256) throw usage("--head-dims: expected head dims of 1 to 256, got " + d);
    o.limits.head_dims.push_back(static_cast<std::int64_t>(n));
  }
  o.gpu_max_work = a.gpu_work;
  if (!(a.repeat_fraction >= 0 && a.repeat_fraction <= 1)) throw usage("--repeat-fraction: expected 0 to 1");
  o.repeat_fraction = a.repeat_fraction;
  o.shrink = !a.no_shrink;
  o.progress_seconds = a.progress;
  if (!a.replay.empty()) {
    const auto colon = a.replay.find(':');
    if (colon == std::string::npos) throw usage("--replay: expected SEED:CASE, got '" + a.replay + "'");
    o.replay = {parse_u64(a.replay.substr(0, colon), "--replay seed"),
                parse_u64(a.replay.substr(colon + 1), "--replay case")};
  }
  if (!a.shape.empty()) {
    if (!o.replay) throw usage("--shape: only with --replay (the sizes of a shrunk case)");
    const std::vector<std::string> v = split(a.shape);
    if (v.size() != 7) throw usage("--shape: expected B,Tq,Tk,Hq,Hkv,D,Dv, got '" + a.shape + "'");
    verify::Shape7 s{};
    for (std::size_t i = 0; i < 7; ++i) s[i] = static_cast<std::int64_t>(parse_u64(v[i], "--shape"));
    o.shape = s;
  }
  return o;
}

std::string summary_json(const verify::FuzzSummary& s, const verify::FuzzOptions& o) {
  nlohmann::json j;
  j["seeds"] = s.seeds;
  j["problems"] = s.problems;
  nlohmann::json per = nlohmann::json::object();
  for (const auto& [seed, n] : s.problems_per_seed) per[std::to_string(seed)] = n;
  j["problems_per_seed"] = per;
  j["seconds"] = s.seconds;
  j["time_budget_hit"] = s.time_budget_hit;
  j["calls"] = s.tally.calls;
  j["checks"] = s.tally.checks;
  j["calls_by_target"] = s.tally.calls_by_target;
  j["skipped"] = s.tally.skipped;
  j["notes"] = s.notes;
  j["work_cap"] = o.limits.max_work;
  j["mismatches"] = s.failures.size();
  nlohmann::json fails = nlohmann::json::array();
  for (const verify::FuzzFailure& f : s.failures) {
    nlohmann::json x;
    x["seed"] = f.seed;
    x["case"] = f.index;
    x["target"] = f.finding.target.text();
    x["problem"] = f.finding.problem;
    x["what"] = f.finding.mismatch.what;
    x["error"] = f.finding.mismatch.err;
    x["tolerance"] = f.finding.mismatch.tol;
    x["where"] = f.finding.mismatch.where;
    x["replay"] = verify::replay_command(f.seed, f.index, f.finding.target, o.limits);
    if (!f.smallest.empty()) x["smallest"] = f.smallest;
    if (!f.run_command.empty()) x["run"] = f.run_command;
    fails.push_back(x);
  }
  j["failures"] = fails;
  return j.dump(2) + "\n";
}

void make_parent(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) throw Error(ErrorCode::io_error, "--save-failures: cannot create " + path + ": " + ec.message());
}

int verify_command(const VerifyArgs& a) {
  if (!a.fuzz && a.replay.empty()) throw usage("verify: give --fuzz (or --replay SEED:CASE)");
  verify::FuzzOptions o = options_from(a);
  OutputSet outs;
  const int json = a.json.empty() ? -1 : outs.add(a.json, "--json");
  if (!a.save_failures.empty()) {
    o.save_failures = a.save_failures;
    o.save_npy = [](const std::string& path, const TensorView& t) {
      make_parent(path);
      write_npy(path, t);
    };
    o.save_text = [](const std::string& path, const std::string& text) {
      make_parent(path);
      std::ofstream f(path);
      f << text;
      if (!f) throw Error(ErrorCode::io_error, "--save-failures: cannot write " + path);
    };
  }
  // A self-test of the fuzzer (tests/verify): every result it receives gets 1 added to its first
  // element before it is checked, so a run must report mismatches and exit 1. The library is not
  // involved.
  if (const char* t = std::getenv("ATTNOPS_VERIFY_TAMPER"); t != nullptr && std::string(t) == "1") {
    std::cout << "verify: ATTNOPS_VERIFY_TAMPER=1: every result is perturbed before it is checked"
              << std::endl;
    o.tamper = [](const verify::Target&, Tensor& t) {
      if (t.numel() > 0) t.set(0, t.at(0) + 1.f);
    };
  }
  o.out = &std::cout;
  std::cout << "verify: seeds";
  for (std::uint64_t s : (o.replay ? std::vector<std::uint64_t>{o.replay->first} : o.seeds))
    std::cout << " " << s;
  std::cout << "; " << (o.problems ? std::to_string(*o.problems) + " problems per seed" : "no problem count")
            << (o.seconds ? "; " + std::to_string(*o.seconds) + " s budget" : "") << "; work cap "
            << o.limits.max_work << std::endl;
  const verify::FuzzSummary s = verify::run_fuzz(o);
  std::cout << "verify: " << s.problems << " problems, " << s.tally.calls << " calls, " << s.tally.checks
            << " checks, " << s.failures.size() << " mismatches in " << static_cast<long>(s.seconds + 0.5)
            << " s" << (s.time_budget_hit ? " (time budget reached)" : "") << "\n";
  for (const auto& [k, n] : s.tally.calls_by_target)
    std::cout << "verify:   " << k << ": " << n << " calls\n";
  for (const auto& [k, n] : s.tally.skipped) std::cout << "verify:   skipped " << n << "x: " << k << "\n";
  if (json >= 0) {
    outs.write(json, summary_json(s, o));
    outs.commit();
  }
  std::cout.flush();
  return s.exit_status();
}

}  // namespace

Command add_verify_command(CLI::App& root) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* app = root.add_subcommand(
      "verify",
      "Differential fuzzer: random problems on every operator, pass, backend, ISA tier and thread "
      "count, against the fp64 oracle (exit 1 on a mismatch)");
  app->add_flag("--fuzz", a->fuzz, "Run the fuzzer");
  app->add_option("--seed", a->seeds, "Seeds: N, a list 1,2,3 or a range 1..8 (repeatable; default 1)");
  a->problems_opt =
      app->add_option("--problems", a->problems, "Problems per seed")->check(CLI::PositiveNumber);
  a->seconds_opt = app->add_option("--seconds", a->seconds, "Time budget of the whole run (s)")
                       ->check(CLI::PositiveNumber);
  app->add_option("--ops", a->ops,
                  "Operators: all, or a list of vanilla,blocksparse,flash_attn2,ragged_paged,ring,ulysses");
  app->add_option("--passes", a->passes, "forward,backward");
  app->add_option("--backends", a->backends, "cpu,gpu,native (gpu: software devices allowed)");
  app->add_option("--tiers", a->tiers, "cpu ISA tiers: all (those this CPU runs) or a list");
  app->add_option("--threads", a->threads,
                  "Thread counts (default 1,2,3 and one more than the hardware threads)");
  app->add_option("--gpu-kernels", a->gpu_kernels,
                  "Vulkan variants forced with ATTNOPS_VK_KERNEL: all, auto or a list");
  app->add_option("--work", a->work, "Largest problem: B*Hq*Tq*Tk*(D+Dv) (default 2^26)")
      ->check(CLI::PositiveNumber);
  app->add_option("--max-seq", a->max_seq, "Longest Tq / Tk / kv_len (default 4096)")
      ->check(CLI::PositiveNumber);
  app->add_option("--gpu-work", a->gpu_work, "Largest problem run on the gpu (default 2^21)");
  app->add_flag("--no-nonfinite", a->no_nonfinite, "Draw no NaN / inf inputs");
  app->add_option("--head-dims", a->head_dims,
                  "Draw D and Dv from this list only (few GPU pipelines: long runs on lavapipe)");
  app->add_option("--repeat-fraction", a->repeat_fraction,
                  "Share of calls repeated for determinism (default 0.25)");
  app->add_flag("--no-shrink", a->no_shrink, "Do not look for a smaller failing case");
  app->add_option("--save-failures", a->save_failures, "Write each failing case's .npy inputs here");
  app->add_option("--replay", a->replay, "Run case SEED:CASE alone (every call repeated)");
  app->add_option("--shape", a->shape, "With --replay: B,Tq,Tk,Hq,Hkv,D,Dv (a shrunk case)");
  app->add_option("--json", a->json, "Write a JSON summary");
  app->add_option("--progress", a->progress, "A progress line every S seconds (0: none; default 30)");
  return {app, [a] { return verify_command(*a); }};
}

}  // namespace attnops::cli
