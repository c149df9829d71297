// `attnops info`, `demo` and `bench` end to end, and unit tests of their helpers (bench specs,
// flag overrides, the progress bar, the gnuplot script).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "attnops/attnops.h"
#include "benchkit/bench_spec.h"
#include "benchkit/median_timer.h"
#include "benchkit/plot.h"
#include "benchkit/progress.h"
#include "cli/settings.h"
#include "tests/cli/cli_runner.h"

namespace attnops::cli {

using namespace benchkit;  // the benchmark harness's specs, timers and yardsticks
namespace {

using testing::CliResult;
using ::testing::HasSubstr;
using testing::run_cli;
using ::testing::StartsWith;
using testing::TempDir;

// ---- helpers --------------------------------------------------------------------------------------

TEST(BenchSpec, ParsesShapes) {
  const BenchShape s = parse_bench_shape("2,8,1:2048,64,2");
  EXPECT_EQ(s.B, 2);
  EXPECT_EQ(s.Hq, 8);
  EXPECT_EQ(s.Hkv, 2);
  EXPECT_EQ(s.Tq, 1);
  EXPECT_EQ(s.Tk, 2048);
  EXPECT_EQ(s.D, 64);
  EXPECT_EQ(s.label(), "B2 H8/2 T1:2048 D64");
  EXPECT_EQ(parse_bench_shapes("1,4,128,32;1,4,256,32").size(), 2u);
  EXPECT_EQ(parse_bench_shape("1,4,128,32").label(), "B1 H4 T128 D32");
  EXPECT_THROW(parse_bench_shape("1,4,128"), Error);
  EXPECT_THROW(parse_bench_shape("1,6,128,32,4"), Error);  // H not a multiple of Hkv
  EXPECT_THROW(parse_bench_shape("1,x,128,32"), Error);
  EXPECT_EQ(parse_causal_mode("both"), (std::vector<bool>{true, false}));
  EXPECT_THROW(parse_causal_mode("sometimes"), Error);
}

TEST(BenchSpec, LoadsFileAndRejectsUnknownKeys) {
  TempDir dir;
  testing::write_file(dir.file("b.yaml"),
                      "ops: [vanilla]\nbackends: [cpu, auto]\nshapes: [\"1,2,64,16\"]\n"
                      "dtypes: [f16]\ncausal: false\nrepeats: 2\nsgemm: 0\n");
  const BenchSpec s = load_bench_file(dir.file("b.yaml"));
  EXPECT_EQ(s.ops, (std::vector<std::string>{"vanilla"}));
  EXPECT_EQ(s.backends, (std::vector<std::string>{"cpu", "auto"}));
  ASSERT_EQ(s.shapes.size(), 1u);
  EXPECT_EQ(s.shapes[0].Tq, 64);
  EXPECT_EQ(s.dtypes, (std::vector<DType>{DType::f16}));
  EXPECT_EQ(s.causal, (std::vector<bool>{false}));
  EXPECT_EQ(s.repeats, 2);
  EXPECT_EQ(s.sgemm, 0);
  testing::write_file(dir.file("bad.yaml"), "ops: [vanilla]\nrepeat: 2\n");
  try {
    load_bench_file(dir.file("bad.yaml"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    EXPECT_THAT(e.what(), HasSubstr("bad.yaml:2"));
    EXPECT_THAT(e.what(), HasSubstr("repeat"));
  }
  testing::write_file(dir.file("bad2.yaml"), "backends: [cuda]\n");
  EXPECT_THROW(load_bench_file(dir.file("bad2.yaml")), Error);
}

// Found by fuzz/fuzz_bench_file: a list as a key escaped as a yaml-cpp exception, and a key with
// a control byte was echoed raw. Both are config_errors naming the file, with the byte escaped.
TEST(BenchSpec, FuzzFindingsAreConfigErrors) {
  const auto message = [](const std::string& text) -> std::string {
    try {
      parse_bench_text(text, "b.yaml");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::config_error) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "accepted: " << text;
    return "";
  };
  EXPECT_THAT(message("[a]: 1\n"), HasSubstr("b.yaml:1:1: key: expected a name"));
  const std::string m = message("ops: [vanilla]\nshap\x1b[2Jes: 1\n");
  EXPECT_THAT(m, HasSubstr("b.yaml:2:1: shap\\x1b[2Jes: unknown key"));
  EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
  EXPECT_EQ(parse_bench_text("repeats: 4\n", "b.yaml").repeats, 4);
}

TEST(Settings, BackendFlagOverridesEveryConfigLevel) {
  const Config config = parse_config(
      "backend: [gpu]\ndisabled_backends: [cpu]\noperators:\n  vanilla:\n    backend: [native]\n");
  CallSettings s;
  s.backends = parse_backend_list("cpu");
  s.softmax_scale = 0.25;
  // As a call's settings (run, demo, bench): the operator keeps the config, the call overrides it.
  AttentionOptions o;
  set_call_settings(o, s);
  const Tensor q(DType::f32, {1, 4, 1, 8});
  const DispatchDecision d = registry().get("vanilla", config).explain(q, q, q, o);
  EXPECT_EQ(d.backend, Backend::cpu) << d.to_json();
  EXPECT_EQ(d.settings.softmax_scale, 0.25);
  // Written into the config (the distributed commands).
  Config c = config;
  apply_to_config(c, s);
  const Attention a = registry().get("vanilla", c);
  ASSERT_FALSE(a.metadata().backends.empty());
  EXPECT_EQ(a.metadata().backends.front(), Backend::cpu);
  EXPECT_THAT(a.metadata().disabled_backends, ::testing::Not(::testing::Contains(Backend::cpu)));
  EXPECT_EQ(a.metadata().softmax_scale, 0.25);
  EXPECT_TRUE(parse_backend_list("auto").empty());
  EXPECT_THROW(parse_backend_list("cpu,quantum"), Error);
}

TEST(Progress, RendersBar) {
  EXPECT_EQ(ProgressBar::render(0, 4, "x", 8), "[........] 0/4 x");
  EXPECT_EQ(ProgressBar::render(2, 4, "", 8), "[####....] 2/4");
  EXPECT_EQ(ProgressBar::render(9, 4, "y", 8), "[########] 4/4 y");
  EXPECT_EQ(ProgressBar::render(0, 0, "", 4), "[####] 0/0");
}

TEST(Progress, DrawsOnlyWhenEnabled) {
  TempDir dir;
  for (bool enabled : {false, true}) {
    const std::string path = dir.file(enabled ? "on" : "off");
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    {
      ProgressBar bar(3, enabled, f);
      bar.update(1, "first");
      bar.update(2, "second");
    }  // the destructor ends the line
    std::fclose(f);
    const std::string text = testing::read_file(path);
    if (enabled) {
      EXPECT_THAT(text, HasSubstr("\r[#"));
      EXPECT_THAT(text, HasSubstr("3/3 done"));
      EXPECT_THAT(text, ::testing::EndsWith("\n"));
    } else {
      EXPECT_EQ(text, "");
    }
  }
}

TEST(Plot, ScriptHasEverySeriesAndTerminal) {
  PlotSpec spec;
  spec.title = "t";
  spec.ylabel = "GFLOP/s";
  spec.categories = {"B1 H8 T512 D64", "B1 H8 T1024 D64"};
  spec.series = {{"vanilla/auto", {10, 12}}, {"blocksparse/cpu", {NAN, 30}}};
  spec.hlines = {{"Eigen SGEMM", 250}};
  const std::string png = gnuplot_script(spec, "x.png");
  EXPECT_THAT(png, HasSubstr("pngcairo"));
  EXPECT_THAT(png, HasSubstr("'vanilla/auto'"));
  EXPECT_THAT(png, HasSubstr("'blocksparse/cpu'"));
  EXPECT_THAT(png, HasSubstr("0 ?"));  // the missing point
  EXPECT_THAT(png, HasSubstr("250 with lines"));
  EXPECT_THAT(gnuplot_script(spec, "x.svg"), HasSubstr("set terminal svg"));
  EXPECT_THROW(gnuplot_script(spec, "x.bmp"), Error);
}

// ---- the commands ---------------------------------------------------------------------------------

TEST(CliInfo, ListsEveryOperatorAndBackend) {
  const CliResult r = run_cli({"info"});
  EXPECT_EQ(r.signal, 0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("CPU:"));
  EXPECT_THAT(r.out, HasSubstr("Vulkan devices"));
  for (const auto& op : registry().list()) EXPECT_THAT(r.out, HasSubstr(op));

  const CliResult j = run_cli({"info", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["operators"].size(), registry().list().size() * 4);
  bool native_tried = false, tpu_tried = false;
  for (const auto& row : doc["operators"]) {
    if (row["backend"] == "native") native_tried = native_tried || row["tried"].get<bool>();
    if (row["backend"] == "tpu") tpu_tried = tpu_tried || row["tried"].get<bool>();
    if (!row["tried"].get<bool>()) {
      EXPECT_FALSE(row["why_not"].get<std::string>().empty()) << row.dump();
    }
  }
  EXPECT_TRUE(native_tried);  // the portable reference is always a candidate
  EXPECT_FALSE(tpu_tried);    // no TPU runtime here
  EXPECT_TRUE(doc["gpu_devices"].is_array());
}

TEST(CliInfo, ConfigCanDisableABackend) {
  TempDir dir;
  testing::write_file(dir.file("c.yaml"), "disabled_backends: [cpu]\n");
  const CliResult r = run_cli({"info", "--json", "--config", dir.file("c.yaml")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The document must outlive the loop: a range-for over a member of a temporary dangles.
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  for (const auto& row : doc["operators"])
    if (row["backend"] == "cpu") {
      EXPECT_FALSE(row["tried"].get<bool>());
      EXPECT_EQ(row["why_not"], "disabled_by_config");
    }
}

// A scripted clock: each now() advances by the next step of `steps` (ms), so that a timed call
// "takes" the step taken at its end.
struct ScriptedClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<ScriptedClock>;
  static constexpr bool is_steady = true;
  static inline std::vector<double> steps;
  static inline std::size_t next = 0;
  static inline double now_ms = 0;
  static time_point now() {
    if (next < steps.size()) now_ms += steps[next++];
    return time_point(
        std::chrono::duration_cast<duration>(std::chrono::duration<double, std::milli>(now_ms)));
  }
};

// The demo's times: a warm-up, then the median of several calls, so that a call that caught the
// scheduler's 4 ms slice (or two) does not become the row's time.
TEST(CliDemo, TimesTheMedianOfSeveralCallsAfterAWarmUp) {
  // now() is read before and after each timed call: steps (0, t) per call.
  ScriptedClock::steps = {0, 8.0, 0, 0.1, 0, 16.0, 0, 0.09, 0, 0.11};
  ScriptedClock::next = 0;
  ScriptedClock::now_ms = 0;
  int calls = 0;
  const CallTimes t = median_call_time<ScriptedClock>([&] { ++calls; }, 5, 5, 0);
  EXPECT_EQ(calls, 6);  // one warm-up + five timed
  EXPECT_EQ(t.calls, 5);
  EXPECT_DOUBLE_EQ(t.median_ms, 0.11);
  // More calls while under the budget, never more than max_calls.
  ScriptedClock::steps.assign(200, 0.5);
  ScriptedClock::next = 0;
  ScriptedClock::now_ms = 0;
  EXPECT_EQ(median_call_time<ScriptedClock>([] {}, 3, 25, 4.9).calls, 10);  // 10 x 0.5 ms reach 4.9
  EXPECT_EQ(median_call_time<ScriptedClock>([&] {}, 3, 7, 1e9).calls, 7);
}

// A bench sample: the call repeated until the sample lasts >= 20 ms (so a 0.04 ms decode is not
// one scheduler slice), at most max_calls times; the mean per call.
TEST(CliBench, ASampleRepeatsTheCallUntilItLasts20MsAndReportsTheMean) {
  ScriptedClock::steps = {0, 5.0, 5.0, 6.0, 5.0, 100.0};  // start, then the end of each call
  ScriptedClock::next = 0;
  ScriptedClock::now_ms = 0;
  int calls = 0;
  EXPECT_DOUBLE_EQ(mean_call_ms<ScriptedClock>([&] { ++calls; }), 21.0 / 4);
  EXPECT_EQ(calls, 4);  // 5, 10, 16, 21 ms: the fourth reaches 20
  ScriptedClock::steps.assign(100, 0.001);
  ScriptedClock::next = 0;
  calls = 0;
  (void)mean_call_ms<ScriptedClock>([&] { ++calls; }, 20, 7);
  EXPECT_EQ(calls, 7);
  EXPECT_DOUBLE_EQ(median_of({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median_of({4, 1, 3, 2}), 3);
}

TEST(CliDemo, ShowsEachFallbackAndSmallErrors) {
  const CliResult r = run_cli({"demo"});
  EXPECT_EQ(r.signal, 0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* code : {"decode", "non_causal", "seq_multiple"}) EXPECT_THAT(r.out, HasSubstr(code));
  // Every row's max error column is small (f32): scan "x.xxe-yy" values.
  std::istringstream lines(r.out);
  std::string line;
  int rows = 0;
  std::getline(lines, line);  // header
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    ++rows;
    std::istringstream f(line);
    std::vector<std::string> cols;
    for (std::string c; f >> c;) cols.push_back(c);
    bool found = false;
    for (const auto& c : cols)
      if (c.find("e-") != std::string::npos || c.find("e+") != std::string::npos) {
        EXPECT_LT(std::stod(c), 1e-4) << line;
        found = true;
      }
    EXPECT_TRUE(found) << line;
  }
  EXPECT_EQ(rows, static_cast<int>(registry().list().size() * 4));
  // The time is the median of several calls (the header says so; each row gives the count).
  EXPECT_THAT(r.out, HasSubstr("median_ms"));
  EXPECT_THAT(r.out, HasSubstr("calls"));
  std::istringstream again(r.out);
  std::getline(again, line);
  const std::size_t calls_at = line.find("calls");
  while (std::getline(again, line))
    if (!line.empty() && calls_at != std::string::npos) {
      EXPECT_GE(std::stoi(line.substr(calls_at, 5)), 5) << line;
    }
}

TEST(CliBench, SmallSweepWritesTableCsvJsonAndPlot) {
  TempDir dir;
  const CliResult r =
      run_cli({"bench", "--ops", "vanilla,blocksparse", "--backends", "auto,native", "--shapes",
               "1,2,128,32;1,2,1:256,32", "--both", "--repeats", "1", "--sgemm", "64", "--csv",
               dir.file("b.csv"), "--json", dir.file("b.json"), "--plot", dir.file("b.svg")});
  EXPECT_EQ(r.signal, 0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("# GFLOP/s"));
  EXPECT_THAT(r.out, HasSubstr("eigen_sgemm"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("\r")));  // no progress bar: stderr is a file

  const std::string csv = testing::read_file(dir.file("b.csv"));
  // header, the ceilings (Eigen SGEMM, oneDNN f32 and bf16: an error text where libdnnl is missing), rows
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 3 + 2 * 2 * 2 * 2);

  const auto doc = nlohmann::json::parse(testing::read_file(dir.file("b.json")));
  ASSERT_EQ(doc["rows"].size(), 16u);
  EXPECT_FALSE(doc["sgemm"]["isa"].get<std::string>().empty()) << doc["sgemm"].dump();
  ASSERT_EQ(doc["gemms"].size(), 2u) << doc.dump();  // oneDNN f32 and bf16, measured or why not
  for (const auto& g : doc["gemms"])
    EXPECT_EQ(g["gflops"].is_number(), g["error"].get<std::string>().empty()) << g.dump();
  const std::string tier = registry().host().cpu().cpu_tier;  // the rows name the cpu tier that ran
  for (const auto& row : doc["rows"]) {
    EXPECT_EQ(row["error"], "") << row.dump();
    if (row["backend"] == "cpu") {
      EXPECT_EQ(row["kernel"], tier) << row.dump();
    }
    EXPECT_GT(row["gflops"].get<double>(), 0) << row.dump();
    EXPECT_GT(row["vs_gemm"].get<double>(), 0) << row.dump();  // every row has a ceiling (Eigen's at least)
    EXPECT_LT(row["max_err"].get<double>(), 1e-4) << row.dump();
    if (row["backend_requested"] == "native") {
      EXPECT_EQ(row["backend"], "native");
    }
    if (row["operator"] == "blocksparse" && row["Tq"] == 1) {
      EXPECT_EQ(row["ran"], "vanilla");
    }
    if (row["operator"] == "blocksparse" && row["causal"] == false) {
      EXPECT_EQ(row["ran"], "vanilla");
    }
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_THAT(testing::read_file(dir.file("b.svg")), HasSubstr("<svg"));
  }
}

TEST(CliBench, FileAndProgressFlag) {
  TempDir dir;
  testing::write_file(dir.file("b.yaml"),
                      "ops: [flash_attn2]\nshapes: [\"1,2,128,16\"]\nrepeats: 1\nsgemm: 0\n");
  const CliResult r = run_cli({"bench", "--file", dir.file("b.yaml"), "--progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("1/1 done"));
  EXPECT_THAT(r.out, HasSubstr("flash_attn2"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("eigen_sgemm")));
}

TEST(CliBench, BadArgumentsExitTwo) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"bench", "--shapes", "1,2,3"},
        {"bench", "--ops", "nope", "--sgemm", "0"},
        {"bench", "--backends", "cuda"},
        {"bench", "--dtypes", "i32"},
        {"bench", "--file", "/nonexistent.yaml"},
        {"bench", "--causal", "--both"},
        {"bench", "--plot", "/tmp/x.bmp", "--shapes", "1,1,8,8", "--sgemm", "0"}}) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.signal, 0);
    EXPECT_EQ(r.exit_code, 2) << args[1] << " " << args[2] << ": " << r.err;
    EXPECT_THAT(r.err, StartsWith("error:"));
  }
}

}  // namespace
}  // namespace attnops::cli
