// `attnops bench --background-load N` (cli/background_load.h): it runs, reports the loaded median
// beside the quiet one in the table, the CSV and the JSON, and leaves no busy process behind,
// whether it ends normally or is killed by a signal. No timing is asserted (a loaded figure is
// whatever the machine gives).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "tests/cli/cli_runner.h"

namespace attnops::cli {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

// Processes whose command line holds `marker` (the busy children are forks of the bench, with its
// command line).
int processes_with(const std::string& marker) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "cmdline");
    std::stringstream s;
    s << f.rdbuf();
    if (s.str().find(marker) != std::string::npos) ++n;
  }
  return n;
}

TEST(CliBenchLoad, ReportsLoadedBesideQuietMediansAndLeavesNoProcess) {
  TempDir dir;
  const std::string json = dir.file("rows.json"), csv = dir.file("rows.csv");
  const testing::CliResult r = testing::run_cli(
      {"bench", "--ops", "vanilla", "--backends", "cpu", "--shapes", "1,2,1:64,16;1,2,32,16", "--repeats",
       "1", "--sgemm", "0", "--threads", "2", "--background-load", "2", "--json", json, "--csv", csv});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 busy background process(es)"));
  EXPECT_THAT(r.out, HasSubstr("loaded_ms "));
  EXPECT_THAT(r.out, HasSubstr("x_quiet "));
  const auto j = nlohmann::json::parse(testing::read_file(json));
  EXPECT_EQ(j.at("background_load"), 2);
  ASSERT_EQ(j.at("rows").size(), 2u);
  for (const auto& row : j.at("rows")) {
    EXPECT_TRUE(row.at("loaded_median_ms").is_number()) << row.dump();
    EXPECT_GT(row.at("loaded_median_ms").get<double>(), 0);
  }
  EXPECT_THAT(testing::read_file(csv), HasSubstr(",loaded_median_ms\n"));
  EXPECT_EQ(processes_with(json), 0);  // every busy child killed and reaped
}

TEST(CliBenchLoad, ASignalLeavesNoBusyProcess) {
  TempDir dir;
  const std::string marker = dir.file("signal.json");
  testing::CliProcess p({"bench", "--ops", "vanilla", "--backends", "cpu", "--shapes", "1,4,1:4096,64",
                         "--repeats", "50", "--sgemm", "0", "--background-load", "1", "--json", marker});
  // Wait until the busy child exists (the bench plus one fork), then kill the bench.
  const auto t0 = std::chrono::steady_clock::now();
  while (processes_with(marker) < 2 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(processes_with(marker), 2) << "the busy child never started";
  ::kill(p.pid(), SIGTERM);
  const testing::CliResult r = p.wait();
  EXPECT_EQ(r.signal, SIGTERM);
  // PR_SET_PDEATHSIG: the kernel kills the child when the bench dies.
  const auto t1 = std::chrono::steady_clock::now();
  while (processes_with(marker) > 0 && std::chrono::steady_clock::now() - t1 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(processes_with(marker), 0);
}

TEST(CliBenchLoad, RejectsANegativeOrHugeCount) {
  for (const char* n : {"-1", "65", "x"}) {
    const testing::CliResult r = testing::run_cli({"bench", "--background-load", n});
    EXPECT_EQ(r.exit_code, 2) << n << ": " << r.err;
  }
}

}  // namespace
}  // namespace attnops::cli
