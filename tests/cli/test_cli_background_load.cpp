// `attnops bench --background-load N` (benchkit/background_load.h): it runs, reports the loaded median
// beside the quiet one in the table, the CSV and the JSON, and leaves no busy process behind,
// whether it ends normally or is killed by a signal. No timing is asserted (a loaded figure is
// whatever the machine gives).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "benchkit/background_load.h"
#include "tests/cli/cli_runner.h"

namespace attnops::cli {

using namespace benchkit;  // the benchmark harness's specs, timers and yardsticks
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

// The children of `parent` now (from /proc/*/stat: "pid (comm) state ppid ...").
std::set<pid_t> children_of(pid_t parent) {
  std::set<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "stat");
    std::string stat;
    if (!std::getline(f, stat)) continue;
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    long ppid = 0;
    if (rest >> state >> ppid && ppid == parent)
      out.insert(static_cast<pid_t>(std::stol(e.path().filename())));
  }
  return out;
}

// Still running (not gone, not a zombie waiting for whoever inherited it).
bool alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return false;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// Runs the bench in the background, collecting its children while it runs; `stop`: SIGTERM it
// once a child was seen. Then every child seen must be gone within 10 s.
std::set<pid_t> children_while_running(testing::CliProcess& p, bool stop, testing::CliResult& result) {
  std::set<pid_t> seen;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    const auto now = children_of(p.pid());
    seen.insert(now.begin(), now.end());
    if (stop && !seen.empty()) break;
    if (!alive(p.pid())) break;  // exited (a zombie until wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (stop) ::kill(p.pid(), SIGTERM);
  result = p.wait();
  return seen;
}

// The state letter of /proc/<pid>/stat ('R', 'S', 'T' stopped, 'Z'; 0 if gone).
char state_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return 0;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : 0;
}

// Waits up to 5 s for every pid to be stopped (or, with stopped = false, not stopped).
bool all_in_state(const std::set<pid_t>& pids, bool stopped) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    bool ok = true;
    for (const pid_t pid : pids) ok = ok && ((state_of(pid) == 'T') == stopped);
    if (ok || std::chrono::steady_clock::now() - t0 > std::chrono::seconds(5)) return ok;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void expect_all_gone(const std::set<pid_t>& pids) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const pid_t pid : pids)
    while (alive(pid) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (const pid_t pid : pids) EXPECT_FALSE(alive(pid)) << "busy child " << pid << " outlived the bench";
}

TEST(CliBenchLoad, ReportsLoadedBesideQuietMediansAndLeavesNoProcess) {
  TempDir dir;
  const std::string json = dir.file("rows.json"), csv = dir.file("rows.csv");
  testing::CliProcess p({"bench", "--ops", "vanilla", "--backends", "cpu", "--shapes",
                         "1,2,1:2048,16;1,2,32,16", "--repeats", "3", "--sgemm", "0", "--threads", "2",
                         "--background-load", "2", "--json", json, "--csv", csv});
  testing::CliResult r;
  const std::set<pid_t> children = children_while_running(p, false, r);
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
  EXPECT_FALSE(children.empty());  // the busy children were seen...
  expect_all_gone(children);       // ...and killed and reaped
}

// The bench alternates quiet and loaded samples by stopping the busy processes between loaded ones:
// pause() must stop every child (no CPU for the quiet sample), resume() restart them, and the
// destructor end them whether they are stopped or running.
TEST(CliBenchLoad, PauseStopsEveryBusyProcessAndResumeRestartsThem) {
  std::set<pid_t> kids;
  {
    BackgroundLoad load(2);
    ASSERT_EQ(load.size(), 2);
    kids = children_of(::getpid());
    ASSERT_EQ(kids.size(), 2u);
    EXPECT_TRUE(all_in_state(kids, false));
    load.pause();
    EXPECT_TRUE(all_in_state(kids, true)) << "a busy process still runs during a quiet sample";
    load.resume(0);
    EXPECT_TRUE(all_in_state(kids, false)) << "a busy process stayed stopped during a loaded sample";
    load.pause();  // destroyed while stopped
  }
  expect_all_gone(kids);
}

TEST(CliBenchLoad, ASignalLeavesNoBusyProcess) {
  TempDir dir;
  testing::CliProcess p({"bench", "--ops", "vanilla", "--backends", "cpu", "--shapes", "1,4,1:4096,64",
                         "--repeats", "50", "--sgemm", "0", "--background-load", "1", "--json",
                         dir.file("rows.json")});
  testing::CliResult r;
  const std::set<pid_t> children = children_while_running(p, true, r);
  ASSERT_FALSE(children.empty()) << "the busy child never started";
  EXPECT_EQ(r.signal, SIGTERM);
  expect_all_gone(children);  // PR_SET_PDEATHSIG: the kernel kills it when the bench dies
}

TEST(CliBenchLoad, RejectsANegativeOrHugeCount) {
  for (const char* n : {"-1", "65", "x"}) {
    const testing::CliResult r = testing::run_cli({"bench", "--background-load", n});
    EXPECT_EQ(r.exit_code, 2) << n << ": " << r.err;
  }
}

}  // namespace
}  // namespace attnops::cli
