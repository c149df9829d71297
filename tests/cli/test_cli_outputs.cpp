// `attnops` output files, the rules of the README's "Processes and files" section: two outputs
// never name one file (however spelled), long names work, write failures are errors, links are
// followed, non-regular targets refused. Each case a defect a reliability probe found.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "cli/inputs.h"
#include "cli/npy.h"
#include "tests/cli/cli_runner.h"

namespace attnops::cli {
namespace {

using testing::CliOptions;
using testing::CliResult;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::TempDir;

// q, k, v, dout in a temporary directory, which is also the child's working directory.
struct Inputs {
  TempDir dir;
  CliOptions in_dir;
  Inputs() {
    in_dir.cwd = dir.path();
    write_npy(dir.file("q.npy"), random_tensor(DType::f32, {1, 8, 2, 4}, 1));
    write_npy(dir.file("k.npy"), random_tensor(DType::f32, {1, 8, 2, 4}, 2));
    write_npy(dir.file("v.npy"), random_tensor(DType::f32, {1, 8, 2, 4}, 3));
    write_npy(dir.file("g.npy"), random_tensor(DType::f32, {1, 8, 2, 4}, 4));
  }
  std::vector<std::string> args(const std::vector<std::string>& outputs) const {
    std::vector<std::string> a{
        "run", "--op",           "vanilla", "--q", dir.file("q.npy"), "--k", dir.file("k.npy"),
        "--v", dir.file("v.npy")};
    a.insert(a.end(), outputs.begin(), outputs.end());
    return a;
  }
  CliResult run(const std::vector<std::string>& outputs) const {
    return testing::run_cli_with(args(outputs), in_dir);
  }
  // Every entry of the directory (recursively) other than the inputs.
  std::vector<std::string> others() const {
    std::vector<std::string> r;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path())) {
      const std::string n = e.path().lexically_relative(dir.path()).string();
      if (n != "q.npy" && n != "k.npy" && n != "v.npy" && n != "g.npy") r.push_back(n);
    }
    return r;
  }
};

void expect_error(const CliResult& r, const std::string& mention) {
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 2) << "stderr: " << r.err;
  EXPECT_THAT(r.err, StartsWith("error:"));
  EXPECT_THAT(r.err, HasSubstr(mention));
}

// ---- two outputs, one file ---------------------------------------------------------------------
// The check compared strings (and identities only of files that existed): each pair below exited
// 0 with one of the two outputs lost.

TEST(CliOutputTargets, OneFileSpelledTwoWaysIsRefused) {
  Inputs in;
  ASSERT_EQ(::mkdir(in.dir.file("a").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(in.dir.path().c_str(), in.dir.file("link").c_str()), 0);
  const std::string abs = in.dir.file("s.npy");
  const std::vector<std::vector<std::string>> cases = {
      {"--out", "s.npy", "--lse-out", "./s.npy"},
      {"--out", abs, "--lse-out", "s.npy"},
      {"--out", "a/../s.npy", "--lse-out", "s.npy"},
      {"--out", "s.npy", "--weights-out", "a//..//s.npy"},
      {"--out", "link/s.npy", "--lse-out", abs},  // a symlinked directory
      {"--out", "o.npy", "--dout", "g.npy", "--dq-out", "x", "--dk-out", "./x"},
      {"--out", "o.npy", "--dout", "g.npy", "--dq-out", "x", "--dv-out", in.dir.file("a/../x")},
  };
  for (const auto& outputs : cases) {
    const CliResult r = in.run(outputs);
    expect_error(r, "is also the output of");
    EXPECT_THAT(in.others(), ::testing::UnorderedElementsAre("a", "link")) << r.err;
  }
}

TEST(CliOutputTargets, ExistingFileByTwoNamesIsRefused) {
  Inputs in;
  testing::write_file(in.dir.file("s.npy"), "old");
  ASSERT_EQ(::link(in.dir.file("s.npy").c_str(), in.dir.file("hard.npy").c_str()), 0);
  ASSERT_EQ(::symlink("s.npy", in.dir.file("soft.npy").c_str()), 0);
  for (const char* other : {"hard.npy", "soft.npy"}) {
    expect_error(in.run({"--out", "s.npy", "--lse-out", other}), "is also the output of --out");
    EXPECT_EQ(testing::read_file(in.dir.file("s.npy")), "old");
  }
}

TEST(CliOutputTargets, DistinctFilesAreAccepted) {
  Inputs in;
  ASSERT_EQ(::mkdir(in.dir.file("a").c_str(), 0755), 0);
  const CliResult r = in.run({"--out", "s.npy", "--lse-out", "a/s.npy"});  // same name, other directory
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_npy(in.dir.file("s.npy")).shape(), (std::vector<std::int64_t>{1, 8, 2, 4}));
  EXPECT_EQ(read_npy(in.dir.file("a/s.npy")).shape(), (std::vector<std::int64_t>{1, 2, 8}));
}

// ---- long names ---------------------------------------------------------------------------------
// Names of 230-255 bytes (NAME_MAX) failed: the temporary's name added 26 bytes to them.

TEST(CliOutputTargets, NamesUpToNameMaxWork) {
  Inputs in;
  for (const std::size_t length : {230u, 240u, 255u}) {
    const std::string name = std::string(length - 4, 'o') + ".npy";
    const CliResult r = in.run({"--out", name, "--lse-out", std::string(length, 'l')});
    ASSERT_EQ(r.exit_code, 0) << length << ": " << r.err;
    EXPECT_EQ(read_npy(in.dir.file(name)).shape(), (std::vector<std::int64_t>{1, 8, 2, 4}));
    EXPECT_EQ(read_npy(in.dir.file(std::string(length, 'l'))).shape(), (std::vector<std::int64_t>{1, 2, 8}));
    EXPECT_EQ(in.others().size(), 2u) << "no temporary left";
    std::filesystem::remove(in.dir.file(name));
    std::filesystem::remove(in.dir.file(std::string(length, 'l')));
  }
}

// ---- links, modes, files that are not regular ------------------------------------------------------
// A symlinked output was replaced by a regular file, a 0600 output came back 0644 and an output
// on a FIFO blocked for ever.

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

TEST(CliOutputTargets, SymlinksAreFollowedAndModesKept) {
  Inputs in;
  ASSERT_EQ(::mkdir(in.dir.file("sub").c_str(), 0755), 0);
  testing::write_file(in.dir.file("real.npy"), "old");
  ASSERT_EQ(::chmod(in.dir.file("real.npy").c_str(), 0600), 0);
  testing::write_file(in.dir.file("plain.npy"), "old");
  ASSERT_EQ(::chmod(in.dir.file("plain.npy").c_str(), 0640), 0);
  ASSERT_EQ(::symlink("real.npy", in.dir.file("link.npy").c_str()), 0);              // to an existing file
  ASSERT_EQ(::symlink("../fresh.npy", in.dir.file("sub/dangling.npy").c_str()), 0);  // to a new one, relative
  ASSERT_EQ(::symlink("link.npy", in.dir.file("chain.npy").c_str()), 0);             // a link to a link
  const CliResult r =
      in.run({"--out", "link.npy", "--lse-out", "sub/dangling.npy", "--weights-out", "plain.npy"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(is_symlink(in.dir.file("link.npy")));
  EXPECT_TRUE(is_symlink(in.dir.file("sub/dangling.npy")));
  EXPECT_EQ(read_npy(in.dir.file("real.npy")).shape(), (std::vector<std::int64_t>{1, 8, 2, 4}));
  EXPECT_EQ(read_npy(in.dir.file("fresh.npy")).shape(), (std::vector<std::int64_t>{1, 2, 8}));
  EXPECT_EQ(read_npy(in.dir.file("plain.npy")).shape(), (std::vector<std::int64_t>{1, 2, 8, 8}));
  EXPECT_EQ(mode_of(in.dir.file("real.npy")), 0600u);
  EXPECT_EQ(mode_of(in.dir.file("plain.npy")), 0640u);
  // chain.npy -> link.npy -> real.npy: the same file as link.npy.
  expect_error(in.run({"--out", "link.npy", "--lse-out", "chain.npy"}), "is also the output of --out");
  // A loop of links is an error, not a hang.
  ASSERT_EQ(::symlink("loop_b", in.dir.file("loop_a").c_str()), 0);
  ASSERT_EQ(::symlink("loop_a", in.dir.file("loop_b").c_str()), 0);
  expect_error(in.run({"--out", "loop_a"}), "loop_a");
}

TEST(CliOutputTargets, NonRegularTargetsAreRefused) {
  Inputs in;
  ASSERT_EQ(::mkfifo(in.dir.file("fifo").c_str(), 0600), 0);
  CliOptions o = in.in_dir;
  o.timeout_seconds = 30;  // it used to block for ever, waiting for a reader
  for (const char* target : {"fifo", "/dev/full", "/dev/zero"}) {
    const CliResult r = testing::run_cli_with(in.args({"--out", target}), o);
    EXPECT_FALSE(r.timed_out) << target;
    expect_error(r, "not a regular file");
  }
  ASSERT_EQ(::symlink("fifo", in.dir.file("to_fifo").c_str()), 0);
  expect_error(testing::run_cli_with(in.args({"--out", "to_fifo"}), o), "not a regular file");
  // /dev/null is accepted (the outputs are computed and discarded), even for several outputs.
  const CliResult r = testing::run_cli_with(in.args({"--out", "/dev/null", "--lse-out", "/dev/null"}), o);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// ---- bench's CSV / JSON / plot files --------------------------------------------------------------
// `--csv /dev/full` and `--json /dev/full` exited 0 (the stream's flush was never checked) and
// `--csv X --json X` silently kept one of the two.

std::vector<std::string> small_bench(std::vector<std::string> outputs) {
  std::vector<std::string> a{"bench",   "--ops",     "vanilla", "--backends", "native", "--shapes",
                             "1,1,8,8", "--repeats", "1",       "--sgemm",    "0",      "--no-progress"};
  a.insert(a.end(), outputs.begin(), outputs.end());
  return a;
}

TEST(CliBenchOutputs, WriteFailuresAreErrors) {
  for (const char* flag : {"--csv", "--json"}) {
    const CliResult r = testing::run_cli(small_bench({flag, "/dev/full"}));
    expect_error(r, flag);
  }
  // A regular file past the file-size limit (ulimit -f): the write fails with EFBIG. (The limit
  // holds for the captured stderr too: the message is shorter; stdout goes to /dev/null.)
  TempDir dir;
  for (const char* flag : {"--csv", "--json"}) {
    CliOptions o;
    o.file_size_limit = 150;  // the CSV header and the JSON's first lines are longer
    o.close_stdout = true;
    const CliResult r = testing::run_cli_with(small_bench({flag, dir.file("rows")}), o);
    expect_error(r, flag);
    EXPECT_THAT(r.err, HasSubstr("File too large"));
    EXPECT_FALSE(std::filesystem::exists(dir.file("rows")));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "no temporary left";
}

TEST(CliBenchOutputs, OneFileForTwoOutputsIsRefusedBeforeTiming) {
  TempDir dir;
  CliOptions o;
  o.cwd = dir.path();
  const CliResult r = testing::run_cli_with(small_bench({"--csv", "rows", "--json", "./rows"}), o);
  expect_error(r, "is also the output of --csv");
  EXPECT_EQ(r.out, "") << "refused before any row ran";
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(CliBenchOutputs, EveryOutputIsWritten) {
  TempDir dir;
  const CliResult r =
      testing::run_cli(small_bench({"--csv", dir.file("b.csv"), "--json", dir.file("b.json")}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(testing::read_file(dir.file("b.csv")), StartsWith("operator,backend_requested"));
  EXPECT_THAT(testing::read_file(dir.file("b.json")), HasSubstr("\"rows\""));
}

}  // namespace
}  // namespace attnops::cli
