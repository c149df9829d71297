// `attnops run --op ring|ulysses` and `attnops bench --distributed` end to end: the real
// binary, on one rank (no launcher: the local operator itself, bitwise) and, in MPI builds,
// under mpiexec with 2 ranks against the single-process run on the same files.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "cli/inputs.h"
#include "cli/npy.h"
#include "tests/cli/cli_runner.h"

namespace attnops::cli {
namespace {

using testing::TempDir;

struct Result {
  int status = -1;
  std::string err;
};

// Runs `command` through the shell, stderr captured.
Result shell(const std::string& command, const TempDir& dir) {
  const std::string err = dir.file("stderr.txt");
  const int rc = std::system((command + " > " + dir.file("stdout.txt") + " 2> " + err).c_str());
  Result r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.err = testing::read_file(err);
  return r;
}

// The program under test: this build's, or ATTNOPS_TEST_CLI's (e.g. main's, to see a new test
// fail before its fix).
std::string cli() {
  const char* other = std::getenv("ATTNOPS_TEST_CLI");
  return other != nullptr && *other != '\0' ? other : ATTNOPS_CLI;
}

std::string mpiexec(int np) {
  return std::string(ATTNOPS_MPIEXEC) + " -n " + std::to_string(np) + " " + ATTNOPS_MPIEXEC_FLAGS + " ";
}

struct Files {
  TempDir dir;
  Files() {
    write_npy(dir.file("q.npy"), random_tensor(DType::f32, {1, 77, 4, 24}, 1));
    write_npy(dir.file("k.npy"), random_tensor(DType::f32, {1, 77, 2, 24}, 2));
    write_npy(dir.file("v.npy"), random_tensor(DType::f32, {1, 77, 2, 24}, 3));
    write_npy(dir.file("g.npy"), random_tensor(DType::f32, {1, 77, 4, 24}, 4));
    write_npy(dir.file("s.npy"), random_tensor(DType::f32, {4}, 5));
  }
  // The common flags and the outputs with `tag` in their names.
  std::string args(const std::string& op, const std::string& tag, const std::string& extra = "") const {
    const auto f = [&](const char* n) { return dir.file(std::string(n) + tag + ".npy"); };
    return cli() + " run --op " + op + " --q " + dir.file("q.npy") + " --k " + dir.file("k.npy") + " --v " +
           dir.file("v.npy") + " --sinks " + dir.file("s.npy") + " --dout " + dir.file("g.npy") +
           " --backend cpu --threads 1 --out " + f("o") + " --lse-out " + f("l") + " --dq-out " + f("dq") +
           " --dk-out " + f("dk") + " --dv-out " + f("dv") + " --dsinks-out " + f("ds") + " " + extra;
  }
  // max |a - b| over every output of two runs (inf for a shape mismatch, NaN-safe).
  double max_diff(const std::string& a, const std::string& b) const {
    double worst = 0;
    for (const char* n : {"o", "l", "dq", "dk", "dv", "ds"}) {
      const Tensor x = read_npy(dir.file(n + a + ".npy")), y = read_npy(dir.file(n + b + ".npy"));
      if (x.shape() != y.shape()) return INFINITY;
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        const double u = x.at(static_cast<std::size_t>(i)), w = y.at(static_cast<std::size_t>(i));
        if (std::isinf(u) && u == w) continue;
        worst = std::max(worst, std::isfinite(u - w) ? std::abs(u - w) : INFINITY);
      }
    }
    return worst;
  }
};

TEST(DistCli, OneRankIsTheLocalOperatorBitwise) {
  Files f;
  ASSERT_EQ(shell(f.args("flash_attn2", "_single", "--window 20,0"), f.dir).status, 0);
  for (const char* op : {"ring", "ulysses"}) {
    const Result r = shell(f.args(op, std::string("_") + op, "--window 20,0 --explain"), f.dir);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find(std::string("\"kernel\": \"") + op + "("), std::string::npos) << r.err;
    EXPECT_EQ(f.max_diff("_single", std::string("_") + op), 0.0) << op;
  }
}

// `attnops info` lists the distributed operators and how they run (under mpirun in an MPI build),
// in its table and in its JSON.
TEST(DistCli, InfoListsRingAndUlyssesAndHowTheyRun) {
  TempDir dir;
  const Result text = shell(cli() + " info", dir);
  ASSERT_EQ(text.status, 0) << text.err;
  const std::string out = testing::read_file(dir.file("stdout.txt"));
  const bool mpi = ATTNOPS_TEST_MPI;
  for (const char* op : {"ring", "ulysses"}) {
    const std::string line = [&] {
      std::istringstream in(out);
      for (std::string l; std::getline(in, l);)
        if (l.rfind(std::string("  ") + op + " ", 0) == 0) return l;
      return std::string();
    }();
    ASSERT_FALSE(line.empty()) << op << " missing in:\n" << out;
    EXPECT_NE(line.find(mpi ? "mpirun -np P attnops run --op " + std::string(op) : "one process"),
              std::string::npos)
        << line;
  }
  const Result json = shell(cli() + " info --json", dir);
  ASSERT_EQ(json.status, 0) << json.err;
  const std::string doc = testing::read_file(dir.file("stdout.txt"));
  for (const char* key : {"\"distributed_operators\"", "\"operator\": \"ring\"", "\"operator\": \"ulysses\"",
                          mpi ? "\"mpi\": true" : "\"mpi\": false"})
    EXPECT_NE(doc.find(key), std::string::npos) << key << " missing in:\n" << doc;
}

#if ATTNOPS_TEST_MPI
TEST(DistCli, TwoRanksUnderMpiexecMatchOneProcess) {
  Files f;
  struct Run {
    const char* op;
    const char* mask;    // for both runs
    const char* layout;  // distributed only
  };
  for (const Run& run : {Run{"ring", "", ""}, Run{"ring", "--window 9,0 --chunk 16", ""},
                         Run{"ring", "--no-causal", "--layout zigzag"}, Run{"ulysses", "--window 9,0", ""}}) {
    ASSERT_EQ(shell(f.args("flash_attn2", "_single", run.mask), f.dir).status, 0);
    const Result r =
        shell(mpiexec(2) + f.args(run.op, "_dist", std::string(run.mask) + " " + run.layout), f.dir);
    ASSERT_EQ(r.status, 0) << run.op << " " << run.mask << ": " << r.err;
    EXPECT_LT(f.max_diff("_single", "_dist"), 2e-5) << run.op << " " << run.mask << " " << run.layout;
  }
}

TEST(DistCli, ErrorsExitTwoOnEveryRankAndWriteNothing) {
  Files f;
  // ulysses: 4 q heads do not divide over 3 ranks (every rank agrees; rank 0 reports it).
  Result r = shell(mpiexec(3) + f.args("ulysses", "_bad"), f.dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("error: ulysses: Hq=4"), std::string::npos) << r.err;
  struct stat st;
  EXPECT_NE(::stat(f.dir.file("o_bad.npy").c_str(), &st), 0) << "an output was written";
  // A missing input file: rank 0's error, every rank exits.
  r = shell(mpiexec(2) + cli() + " run --op ring --q " + f.dir.file("nope.npy") + " --k " +
                f.dir.file("k.npy") + " --v " + f.dir.file("v.npy") + " --out " + f.dir.file("o_bad.npy"),
            f.dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("error: npy file"), std::string::npos) << r.err;
}

// Inputs whose shapes disagree with q / k are refused by rank 0's agreed checks, naming the flag,
// before any shard moves (not an abort from inside the scatter, naming neither).
// Command-line errors carry the "error:" prefix of the single-process run.
TEST(DistCli, WrongLengthInputsAndBadCommandLinesAreAgreedErrorsNamingTheFlag) {
  Files f;
  write_npy(f.dir.file("g23.npy"), random_tensor(DType::f32, {1, 23, 4, 24}, 6));
  write_npy(f.dir.file("sq.npy"), Tensor(DType::i32, {1, 77}));
  write_npy(f.dir.file("skv23.npy"), Tensor(DType::i32, {1, 23}));
  write_npy(f.dir.file("sq2.npy"), Tensor(DType::i32, {2, 77}));
  const std::string base = cli() + " run --op ring --q " + f.dir.file("q.npy") + " --k " +
                           f.dir.file("k.npy") + " --v " + f.dir.file("v.npy") + " --out " +
                           f.dir.file("o_bad.npy") + " --backend cpu ";
  struct Bad {
    std::string args, want;
  };
  const Bad cases[] = {
      {"--dout " + f.dir.file("g23.npy") + " --dq-out " + f.dir.file("dq_bad.npy"),
       "error: --dout: expected"},
      {"--segment-ids-q " + f.dir.file("sq.npy") + " --segment-ids-kv " + f.dir.file("skv23.npy"),
       "error: --segment-ids-kv: expected"},
      {"--segment-ids-q " + f.dir.file("sq2.npy") + " --segment-ids-kv " + f.dir.file("skv23.npy"),
       "error: --segment-ids-q: expected"},
  };
  for (const Bad& b : cases) {
    const Result r = shell(mpiexec(2) + base + b.args, f.dir);
    EXPECT_EQ(r.status, 2) << b.args << ": " << r.err;
    EXPECT_NE(r.err.find(b.want), std::string::npos) << b.args << ": " << r.err;
    EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << "the job was aborted: " << r.err;
    struct stat st;
    EXPECT_NE(::stat(f.dir.file("o_bad.npy").c_str(), &st), 0) << "an output was written";
  }
  // A command-line error (a required flag missing, an unknown flag) on every rank, reported once.
  for (const std::string& args :
       {cli() + " run --op ring --q " + f.dir.file("q.npy"), base + "--no-such-flag"}) {
    const Result r = shell(mpiexec(2) + args, f.dir);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << args << ": " << r.err;
  }
}

TEST(DistCli, BenchRunsAndProjects) {
  TempDir dir;
  const Result r = shell(mpiexec(2) + cli() +
                             " bench --distributed --shapes 1,2,128,16 --repeats 1 --ops ring,ulysses "
                             "--project --project-tokens 65536 --csv " +
                             dir.file("b.csv"),
                         dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string out = testing::read_file(dir.file("stdout.txt"));
  for (const char* s : {"ring     zigzag", "ring     contiguous", "ulysses", "ring cost model",
                        "fewest tokens per rank", "strong scaling of T = 65536"})
    EXPECT_NE(out.find(s), std::string::npos) << s << " missing in:\n" << out;
  EXPECT_NE(testing::read_file(dir.file("b.csv")).find("op,layout,B,Hq"), std::string::npos);
}
#endif

}  // namespace
}  // namespace attnops::cli
