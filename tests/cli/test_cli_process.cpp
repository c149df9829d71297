// `attnops` as a Unix process, the rules of the README's "Processes and files" section: closed
// standard descriptors, signals (SIGINT, SIGTERM, SIGXFSZ) and the environment. Each case a
// defect a reliability probe found.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
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

struct Inputs {
  TempDir dir;
  Tensor q, k, v;
  explicit Inputs(std::int64_t T = 16, std::int64_t H = 2, std::int64_t D = 8)
      : q(random_tensor(DType::f32, {1, T, H, D}, 1)),
        k(random_tensor(DType::f32, {1, T, H, D}, 2)),
        v(random_tensor(DType::f32, {1, T, H, D}, 3)) {
    write_npy(dir.file("q.npy"), q);
    write_npy(dir.file("k.npy"), k);
    write_npy(dir.file("v.npy"), v);
  }
  std::vector<std::string> args(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a{"run",
                               "--op",
                               "vanilla",
                               "--q",
                               dir.file("q.npy"),
                               "--k",
                               dir.file("k.npy"),
                               "--v",
                               dir.file("v.npy"),
                               "--out",
                               dir.file("out.npy")};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::vector<std::string> others() const {
    std::vector<std::string> r;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      const std::string n = e.path().filename().string();
      if (n != "q.npy" && n != "k.npy" && n != "v.npy") r.push_back(n);
    }
    return r;
  }
  // The largest difference of out.npy from the fp64 oracle's output.
  double error_of_output() const {
    const auto want = native::reference_attention_f64(make_problem(q, k, v, {}, {}), false);
    const Tensor out = read_npy(dir.file("out.npy"));
    double worst = 0;
    for (std::size_t i = 0; i < want.out.size(); ++i)
      worst = std::max(worst, std::abs(out.at(i) - want.out[i]));
    return worst;
  }
};

// ---- closed standard descriptors ------------------------------------------------------------------
// With 2>&- the temporary output file became descriptor 2 and the dispatch log and warnings were
// written into the .npy (exit 0, an unreadable file).

TEST(CliStandardDescriptors, ClosedStderrNeverReachesAnOutput) {
  Inputs in;
  for (const bool close_stdout : {false, true}) {
    CliOptions o;
    o.close_stdin = true;
    o.close_stderr = true;
    o.close_stdout = close_stdout;
    o.env = {{"ATTNOPS_LOG", "dispatch"}, {"ATTNOPS_CPU_ISA", "no-such-tier"}};  // a log line and a warning
    const CliResult r = testing::run_cli_with(
        in.args({"--explain", "--lse-out", in.dir.file("lse.npy"), "--backend", "cpu"}), o);
    EXPECT_EQ(r.signal, 0);
    ASSERT_EQ(r.exit_code, 0) << close_stdout;
    EXPECT_LE(in.error_of_output(), 2e-5);  // read_npy throws on a corrupted file
    EXPECT_EQ(read_npy(in.dir.file("lse.npy")).shape(), (std::vector<std::int64_t>{1, 2, 16}));
  }
}

// ---- the environment -------------------------------------------------------------------------------
// ATTNOPS_FORCE_NATIVE=no forced native (anything but "0" and "false" did).

TEST(CliEnvironment, ForceNativeTakesYesOrNo) {
  Inputs in;
  const auto backend_with = [&](const std::optional<std::string>& value) {
    CliOptions o;
    o.env = {{"ATTNOPS_FORCE_NATIVE", value}};
    return testing::run_cli_with(in.args({"--backend", "cpu", "--explain"}), o);
  };
  for (const char* on : {"1", "true", "yes", "TRUE", "Yes"}) {
    const CliResult r = backend_with(std::string(on));
    ASSERT_EQ(r.exit_code, 0) << on << ": " << r.err;
    EXPECT_THAT(r.last_err_line(), HasSubstr("\"backend\": \"native\"")) << on;
  }
  for (const std::optional<std::string>& off :
       {std::optional<std::string>("0"), std::optional<std::string>("false"),
        std::optional<std::string>("no"), std::optional<std::string>("NO"), std::optional<std::string>(""),
        std::optional<std::string>()}) {
    const CliResult r = backend_with(off);
    ASSERT_EQ(r.exit_code, 0) << off.value_or("(unset)") << ": " << r.err;
    EXPECT_THAT(r.last_err_line(), HasSubstr("\"backend\": \"cpu\"")) << off.value_or("(unset)");
  }
  std::filesystem::remove(in.dir.file("out.npy"));
  for (const char* bad : {"maybe", "2", "on"}) {
    const CliResult r = backend_with(std::string(bad));
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_THAT(r.err, HasSubstr("ATTNOPS_FORCE_NATIVE"));
    EXPECT_THAT(r.err, HasSubstr("[invalid_argument]"));
    EXPECT_THAT(in.others(), ::testing::IsEmpty());
  }
}

// ---- signals ----------------------------------------------------------------------------------------
// SIGINT or SIGTERM during a run left the hidden temporary output behind every time; a file-size
// limit killed the process with SIGXFSZ and left a partial temporary.

// Waits (up to 60 s) until the directory holds a hidden temporary (the outputs are reserved
// before the work starts). Returns whether one appeared.
bool wait_for_temporary(const Inputs& in) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    for (const std::string& n : in.others())
      if (!n.empty() && n[0] == '.') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

TEST(CliSignals, InterruptRemovesTheTemporaries) {
  // The native (fp64, one thread) run of this shape takes seconds: the signal arrives mid-run.
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    const Inputs in(1024, 8, 64);
    testing::CliProcess p(in.args(
        {"--backend", "native", "--lse-out", in.dir.file("lse.npy"), "--weights-out", in.dir.file("w.npy")}));
    ASSERT_TRUE(wait_for_temporary(in)) << "no temporary output appeared";
    ASSERT_EQ(::kill(p.pid(), sig), 0);
    const CliResult r = p.wait();
    EXPECT_EQ(r.signal, sig) << "exit " << r.exit_code << ": "
                             << r.err;  // dies of it: the shell says 128 + sig
    EXPECT_THAT(in.others(), ::testing::IsEmpty()) << "signal " << sig;
  }
}

TEST(CliSignals, FileSizeLimitIsAnIoError) {
  Inputs in;
  CliOptions o;
  o.file_size_limit = 1000;  // out.npy is 128 + 1024 bytes
  const CliResult r = testing::run_cli_with(in.args({"--lse-out", in.dir.file("lse.npy")}), o);
  EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal;
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, StartsWith("error:"));
  EXPECT_THAT(r.err, HasSubstr("File too large"));
  EXPECT_THAT(r.err, HasSubstr("[io_error]"));
  EXPECT_THAT(in.others(), ::testing::IsEmpty());
}

}  // namespace
}  // namespace attnops::cli
