// `attnops verify` end to end: exit 0 on a clean run, exit 1 with one MISMATCH line and a replay
// command when results are wrong (ATTNOPS_VERIFY_TAMPER=1 perturbs what the fuzzer receives),
// the replay command reproducing the same line, --save-failures writing a case `attnops run`
// reruns, the JSON summary, and usage errors exiting 2.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_runner.h"

namespace attnops::cli {
namespace {

using ::testing::HasSubstr;
using testing::run_cli;
using testing::TempDir;

const std::vector<std::string> kSmall = {
    "verify",  "--fuzz",  "--seed",   "1",         "--problems", "3",      "--ops", "vanilla",    "--passes",
    "forward", "--tiers", "baseline", "--threads", "1",          "--work", "20000", "--progress", "0"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.find(needle) != std::string::npos) out.push_back(l);
  return out;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(VerifyCli, CleanRunExitsZero) {
  TempDir dir;
  const auto r = run_cli(with(kSmall, {"--json", dir.file("s.json")}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("verify: 3 problems"));
  EXPECT_THAT(r.out, HasSubstr("0 mismatches"));
  const auto j = nlohmann::json::parse(testing::read_file(dir.file("s.json")));
  EXPECT_EQ(j["problems"], 3);
  EXPECT_EQ(j["mismatches"], 0);
  EXPECT_GT(j["calls"].get<int>(), 0);
}

TEST(VerifyCli, WrongResultsExitOneWithReplayLinesThatReplay) {
  TempDir dir;
  const auto r =
      run_cli(with(kSmall, {"--json", dir.file("s.json"), "--no-shrink"}), {{"ATTNOPS_VERIFY_TAMPER", "1"}});
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto found = lines_with(r.out, "MISMATCH seed=1 case=");
  ASSERT_FALSE(found.empty()) << r.out;
  const std::string& line = found.front();
  EXPECT_THAT(line, HasSubstr("vanilla forward cpu baseline threads=1"));
  EXPECT_THAT(line, HasSubstr("out: max err"));
  const auto at = line.find("replay: attnops ");
  ASSERT_NE(at, std::string::npos) << line;
  const auto j = nlohmann::json::parse(testing::read_file(dir.file("s.json")));
  EXPECT_EQ(j["mismatches"].get<std::size_t>(), lines_with(r.out, "MISMATCH").size());
  // The replay command, as printed, finds the same mismatch.
  const std::vector<std::string> args = words(line.substr(at + std::string("replay: attnops ").size()));
  const auto again = run_cli(args, {{"ATTNOPS_VERIFY_TAMPER", "1"}});
  ASSERT_EQ(again.exit_code, 1) << again.out << again.err;
  const auto replayed = lines_with(again.out, "MISMATCH");
  ASSERT_FALSE(replayed.empty());
  EXPECT_EQ(replayed.front(), line);
}

TEST(VerifyCli, SavedFailuresRerunWithAttnopsRun) {
  TempDir dir;
  const auto r = run_cli(with(kSmall, {"--save-failures", dir.file("fail"), "--no-shrink"}),
                         {{"ATTNOPS_VERIFY_TAMPER", "1"}});
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto cmds = lines_with(r.out, "  reproduce: ");
  ASSERT_FALSE(cmds.empty()) << r.out;
  std::vector<std::string> args = words(cmds.front().substr(cmds.front().find("reproduce: ") + 11));
  std::map<std::string, std::optional<std::string>> env;
  while (!args.empty() && args.front().find('=') != std::string::npos && args.front().rfind("--", 0) != 0) {
    const auto eq = args.front().find('=');
    env[args.front().substr(0, eq)] = args.front().substr(eq + 1);
    args.erase(args.begin());
  }
  ASSERT_EQ(args.front(), "attnops");
  args.erase(args.begin());
  const auto hash = std::find(args.begin(), args.end(), "#");
  args.erase(hash, args.end());
  const auto run = run_cli(args, env);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  bool out_written = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.file("fail")))
    out_written = out_written || e.path().filename() == "out.npy";
  EXPECT_TRUE(out_written);
}

// A saved case over an 8-bit cache (codes, scales, --kv-dtype) reruns with `attnops run`.
TEST(VerifyCli, SavedEightBitPagedCasesRerunWithAttnopsRun) {
  TempDir dir;
  const std::vector<std::string> paged = {
      "verify",        "--fuzz",       "--seed",     "21",       "--problems",  "12",
      "--ops",         "ragged_paged", "--tiers",    "baseline", "--threads",   "1",
      "--work",        "100000",       "--progress", "0",        "--no-shrink", "--save-failures",
      dir.file("fail")};
  const auto r = run_cli(paged, {{"ATTNOPS_VERIFY_TAMPER", "1"}});
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  int reran = 0;
  for (const std::string& line : lines_with(r.out, "  reproduce: ")) {
    if (line.find("--kv-dtype") == std::string::npos) continue;
    std::vector<std::string> args = words(line.substr(line.find("reproduce: ") + 11));
    std::map<std::string, std::optional<std::string>> env;
    while (!args.empty() && args.front().find('=') != std::string::npos && args.front().rfind("--", 0) != 0) {
      const auto eq = args.front().find('=');
      env[args.front().substr(0, eq)] = args.front().substr(eq + 1);
      args.erase(args.begin());
    }
    ASSERT_EQ(args.front(), "attnops");
    args.erase(args.begin());
    const auto run = run_cli(args, env);
    EXPECT_EQ(run.exit_code, 0) << line << "\n" << run.err;
    ++reran;
  }
  EXPECT_GE(reran, 2) << r.out;
}

TEST(VerifyCli, UsageErrorsExitTwo) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"verify"},
                                               {"verify", "--fuzz", "--tiers", "avx9"},
                                               {"verify", "--fuzz", "--passes", "sideways"},
                                               {"verify", "--replay", "7"},
                                               {"verify", "--fuzz", "--shape", "1,2,3,4,5,6,7"},
                                               {"verify", "--fuzz", "--seed", "x"},
                                               {"verify", "--fuzz", "--backends", "tpu"},
                                               {"verify", "--fuzz", "--ops", "nope"}}) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args.back() << ": " << r.out << r.err;
    EXPECT_THAT(r.last_err_line(), HasSubstr("error:")) << args.back();
  }
}

}  // namespace
}  // namespace attnops::cli
