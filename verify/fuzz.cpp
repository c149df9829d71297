#include "verify/fuzz.h"

#include <algorithm>
#include <chrono>

#include "attnops/dist/sequence_parallel.h"
#include "verify/run_dense.h"
#include "verify/run_dist.h"
#include "verify/run_paged.h"

namespace attnops::verify {

namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

bool has(const std::vector<Target>& ts, bool (*pred)(const std::string&)) {
  return std::any_of(ts.begin(), ts.end(), [&](const Target& t) { return pred(t.op); });
}
bool is_paged(const std::string& op) {
  return op == "ragged_paged";
}
bool dense_or_dist(const std::string& op) {
  return is_dense_op(op) || is_dist_op(op);
}

// A case's targets: the gpu ones narrowed to one kernel variant per case (drawn), so that a run
// over many cases covers every variant at the cost of one.
std::vector<Target> case_targets(const std::vector<Target>& all, Rng& rng) {
  std::vector<std::string> variants;
  for (const Target& t : all)
    if (t.backend == Backend::gpu && std::find(variants.begin(), variants.end(), t.kernel) == variants.end())
      variants.push_back(t.kernel);
  const std::string pick = variants.empty() ? "" : rng.pick(variants);
  std::vector<Target> out;
  for (const Target& t : all)
    if (t.backend != Backend::gpu || t.kernel == pick) out.push_back(t);
  return out;
}

// The targets a shrink try runs: the failing one, and for a comparison across thread counts the
// same group at the other thread counts.
std::vector<Target> shrink_targets(const std::vector<Target>& all, const Finding& f) {
  std::vector<Target> out;
  const bool across = f.mismatch.what.rfind("bitwise across", 0) == 0;
  for (const Target& t : all)
    if (t.op == f.target.op && t.pass == f.target.pass && t.backend == f.target.backend &&
        t.kernel == f.target.kernel && (across || t.threads == f.target.threads))
      out.push_back(t);
  return out;
}

std::string first_word(const std::string& s) {
  return s.substr(0, s.find_first_of(" ("));
}

}  // namespace

FuzzSummary run_fuzz(const FuzzOptions& o) {
  const auto start = clock_type::now();
  Registry& registry = o.registry ? *o.registry : attnops::registry();
  FuzzSummary sum;
  sum.seeds = o.replay ? std::vector<std::uint64_t>{o.replay->first} : o.seeds;
  const TargetPlan plan = plan_targets(registry, o.request);
  sum.notes = plan.notes;
  if (has(plan.targets, is_dist_op)) {
    const std::vector<std::string> names = registry.list();
    if (std::find(names.begin(), names.end(), "ring") == names.end())
      dist::register_distributed_operators(registry);
  }
  RunSettings rs;
  rs.registry = &registry;
  rs.repeat_fraction = o.repeat_fraction;
  rs.gpu_max_work = o.gpu_max_work;
  rs.tamper = o.tamper;
  const auto say = [&](const std::string& line) {
    if (o.out) *o.out << line << std::endl;
  };
  for (const std::string& n : plan.notes) say("verify: note: " + n);
  if (plan.targets.empty()) {
    sum.notes.push_back("nothing to run: no target left");
    say("verify: nothing to run: no target left");
    return sum;
  }
  const bool want_dense = has(plan.targets, dense_or_dist), want_paged = has(plan.targets, is_paged);
  double next_progress = o.progress_seconds;

  const auto run_case = [&](std::uint64_t seed, std::uint64_t index) {
    Rng sched = Rng::for_case(seed, index, kStreamSchedule);
    const std::vector<Target> targets = case_targets(plan.targets, sched);
    const bool repeat = o.replay.has_value() || sched.chance(o.repeat_fraction);
    std::vector<Finding> found;
    std::optional<DenseSpec> dense;
    std::optional<PagedSpec> paged;
    if (want_dense) {
      dense = draw_dense(seed, index, o.limits);
      if (o.shape) {
        const Shape7& s = *o.shape;
        dense = with_shape(*dense, s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
      }
      for (auto& f : run_dense(rs, *dense, targets, repeat, sum.tally)) found.push_back(std::move(f));
      for (auto& f : run_dist(rs, *dense, targets, sum.tally)) found.push_back(std::move(f));
    }
    if (want_paged) {
      paged = draw_paged(seed, index, o.limits);
      for (auto& f : run_paged(rs, *paged, targets, repeat, sum.tally)) found.push_back(std::move(f));
    }
    ++sum.problems;
    ++sum.problems_per_seed[seed];
    bool shrunk = false;
    for (Finding& f : found) {
      FuzzFailure ff{seed, index, f, failure_line(seed, index, f, o.limits), "", ""};
      say(ff.line);
      const bool is_dense_finding = is_dense_op(f.target.op) || is_dist_op(f.target.op);
      // One shrink per case (the first dense finding), and none once the time budget is spent:
      // a broken kernel fails many targets of a case, and each shrink reruns the case dozens of times.
      const bool in_time = !o.seconds || since(start) < *o.seconds;
      if (o.shrink && is_dense_finding && dense && in_time && !shrunk) {
        shrunk = true;
        const std::vector<Target> ts = shrink_targets(plan.targets, f);
        const std::string kind = first_word(f.mismatch.what);
        const auto fails = [&](const DenseSpec& s) {
          Tally scratch;
          std::vector<Finding> again =
              is_dist_op(f.target.op) ? run_dist(rs, s, ts, scratch) : run_dense(rs, s, ts, true, scratch);
          return std::any_of(again.begin(), again.end(),
                             [&](const Finding& g) { return first_word(g.mismatch.what) == kind; });
        };
        const ShrinkResult r = shrink_dense(*dense, fails, o.shrink_budget);
        if (r.smaller) {
          ff.smallest = "smallest failing (" + std::to_string(r.tries) + " tries): " + r.spec.describe() +
                        " | replay: " + replay_command(seed, index, f.target, o.limits, shape_of(r.spec));
          say("  " + ff.smallest);
        }
      }
      if (!o.save_failures.empty() && o.save_npy && o.save_text) {
        const std::string dir =
            o.save_failures + "/seed" + std::to_string(seed) + "_case" + std::to_string(index) + "_" +
            f.target.op + "_" + std::string(pass_name(f.target.pass)) + "_" +
            std::string(backend_name(f.target.backend)) +
            (f.target.kernel.empty() ? "" : "_" + f.target.kernel) + "_t" + std::to_string(f.target.threads);
        try {
          ff.run_command = f.target.op == "ragged_paged"
                               ? save_paged_case(*paged, f.target, dir, o.save_npy)
                               : save_dense_case(*dense, f.target, dir, o.save_npy, o.save_text);
          say("  reproduce: " + ff.run_command);
        } catch (const std::exception& e) {
          say(std::string("  (could not save the case: ") + e.what() + ")");
        }
      }
      sum.failures.push_back(std::move(ff));
    }
  };

  // Without a count or a time budget a run would never end: 100 problems per seed then.
  const std::optional<std::int64_t> problems =
      o.problems || o.seconds ? o.problems : std::optional<std::int64_t>(100);
  if (o.replay) {
    run_case(o.replay->first, o.replay->second);
  } else {
    for (std::uint64_t c = 0;; ++c) {
      bool any = false;
      for (std::uint64_t seed : o.seeds) {
        if (problems && static_cast<std::int64_t>(c) >= *problems) continue;
        if (o.seconds && since(start) >= *o.seconds) {
          sum.time_budget_hit = true;
          break;
        }
        any = true;
        run_case(seed, c);
        if (o.progress_seconds > 0 && since(start) >= next_progress) {
          next_progress += o.progress_seconds;
          say("verify: " + std::to_string(sum.problems) + " problems, " + std::to_string(sum.tally.calls) +
              " calls, " + std::to_string(sum.failures.size()) + " mismatches, " +
              std::to_string(static_cast<int>(since(start))) + " s");
        }
      }
      if (!any || sum.time_budget_hit) break;
    }
  }
  restore_environment();
  sum.seconds = since(start);
  return sum;
}

}  // namespace attnops::verify
