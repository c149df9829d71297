// `attnops run` (and `bench`) against hostile inputs, each a defect a reliability probe found:
// unbounded reads of /dev/zero as an array or a YAML file, outputs left behind when another
// output fails, header numbers that overflowed, control bytes echoed to the terminal, scales f32
// cannot honour, and absurd thread counts. Every case exits 2 with "error:" (or 0 with a right
// answer) and leaves no file behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "cli/inputs.h"
#include "cli/npy.h"
#include "tests/cli/cli_runner.h"
#include "tests/cli/npy_image.h"

namespace attnops::cli {
namespace {

using testing::CliResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::run_cli;
using ::testing::StartsWith;
using testing::TempDir;

struct Inputs {
  TempDir dir;
  Tensor q = random_tensor(DType::f32, {1, 16, 2, 8}, 1), k = random_tensor(DType::f32, {1, 16, 2, 8}, 2),
         v = random_tensor(DType::f32, {1, 16, 2, 8}, 3);
  std::string q_path = dir.file("q.npy"), k_path = dir.file("k.npy"), v_path = dir.file("v.npy");
  std::string out_path = dir.file("out.npy");
  Inputs() {
    write_npy(q_path, q);
    write_npy(k_path, k);
    write_npy(v_path, v);
  }
  std::vector<std::string> args(std::vector<std::string> extra = {}, const std::string& q_file = "") const {
    std::vector<std::string> a{"run",   "--op", "vanilla", "--q",  q_file.empty() ? q_path : q_file,
                               "--k",   k_path, "--v",     v_path, "--out",
                               out_path};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // The directory's files other than the inputs (outputs and any temporary left behind).
  std::vector<std::string> others() const {
    std::vector<std::string> r;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      const std::string n = e.path().filename().string();
      if (n != "q.npy" && n != "k.npy" && n != "v.npy") r.push_back(n);
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

// ---- unbounded reads: each of these read its whole input (4 GB of /dev/zero in 21 s) -------------

TEST(CliUnboundedReads, DevZeroAsAnArray) {
  Inputs in;
  expect_error(run_cli(in.args({}, "/dev/zero")), "/dev/zero");
  EXPECT_THAT(run_cli(in.args({}, "/dev/zero")).err, HasSubstr("magic"));
}

TEST(CliUnboundedReads, DevZeroAsAConfigOrBenchFile) {
  Inputs in;
  expect_error(run_cli(in.args({"--config", "/dev/zero"})), "at most 262144 bytes");
  expect_error(run_cli({"bench", "--file", "/dev/zero", "--no-progress"}), "at most 262144 bytes");
}

TEST(CliUnboundedReads, OversizedYamlIsRefusedBeforeParsing) {
  Inputs in;
  std::string yaml;
  for (int i = 0; yaml.size() <= 300000; ++i) yaml += "key_" + std::to_string(i) + ": 1\n";
  const std::string path = in.dir.file("big.yaml");
  testing::write_file(path, yaml);
  expect_error(run_cli(in.args({"--config", path})), "big.yaml");
}

TEST(CliUnboundedReads, HeaderDeclaringMoreThanTheFileHolds) {
  Inputs in;
  // 2^40 elements declared, 16 bytes present: refused from the file size, nothing allocated.
  const std::string path = in.dir.file("huge.npy");
  testing::write_file(path, testing::npy_image(1,
                                               "{'descr': '<f4', 'fortran_order': False, 'shape': "
                                               "(1, 1048576, 1, 1048576), }",
                                               std::string(16, '\0')));
  expect_error(run_cli(in.args({}, path)), "truncated");
}

// ---- bench sweeps larger than the machine -----------------------------------------------------------
// A bench file of a few KiB expanding to a million rows, or a shape whose tensors exceed the
// memory, grew without bound (allocating every row, then every tensor) instead of failing.

TEST(CliUnboundedReads, BenchSweepsAreSizedBeforeAnything) {
  TempDir dir;
  std::string backends = "backends: [", shapes = "shapes: [";
  for (int i = 0; i < 1000; ++i) {
    backends += i ? ", auto" : "auto";
    shapes += i ? ", \"1,1,8,8\"" : "\"1,1,8,8\"";
  }
  testing::write_file(dir.file("huge.yaml"),
                      "ops: [vanilla]\n" + backends + "]\n" + shapes + "]\nsgemm: 0\n");
  testing::CliOptions o;
  o.timeout_seconds = 60;  // it used to start timing a million rows
  CliResult r = testing::run_cli_with({"bench", "--file", dir.file("huge.yaml"), "--no-progress"}, o);
  EXPECT_FALSE(r.timed_out);
  expect_error(r, "1000000 rows");
  EXPECT_THAT(r.err, HasSubstr("[invalid_argument]"));
  EXPECT_EQ(r.out, "");
  // 2 TB of q, k and v for one row: refused before any row is timed or any tensor allocated.
  r = testing::run_cli_with({"bench", "--ops", "vanilla", "--backends", "native", "--shapes",
                             "1,1,8,8;1,8,1000000000,64", "--sgemm", "0", "--no-progress"},
                            o);
  EXPECT_FALSE(r.timed_out);
  expect_error(r, "B1 H8 T1000000000 D64");
  EXPECT_THAT(r.err, HasSubstr("[out_of_memory]"));
  EXPECT_EQ(r.out, "");
  r = testing::run_cli_with({"bench", "--shapes", "1,1,8,8", "--sgemm", "2000000000", "--no-progress"}, o);
  expect_error(r, "sgemm: 2000000000");
  EXPECT_EQ(r.out, "");
}

// ---- outputs: all or nothing ------------------------------------------------------------------

TEST(CliOutputs, FailingLseOutLeavesNoOut) {
  Inputs in;
  const CliResult r = run_cli(in.args({"--lse-out", in.dir.file("missing/dir/l.npy")}));
  expect_error(r, "--lse-out");
  EXPECT_THAT(in.others(), ::testing::IsEmpty());  // no out.npy, no temporary
}

TEST(CliOutputs, FailingWeightsOutLeavesNothing) {
  Inputs in;
  const CliResult r = run_cli(
      in.args({"--lse-out", in.dir.file("l.npy"), "--weights-out", in.dir.file("missing/dir/w.npy")}));
  expect_error(r, "--weights-out");
  EXPECT_THAT(in.others(), ::testing::IsEmpty());
}

TEST(CliOutputs, AnErrorAfterReservingKeepsTheOldOutput) {
  Inputs in;
  testing::write_file(in.out_path, "old content");
  // The outputs are reserved, then the inputs fail to validate (k's head_dim differs).
  const std::string bad_k = in.dir.file("bad_k.npy");
  write_npy(bad_k, random_tensor(DType::f32, {1, 16, 2, 4}, 9));
  const CliResult r = run_cli({"run", "--op", "vanilla", "--q", in.q_path, "--k", bad_k, "--v", in.v_path,
                               "--out", in.out_path, "--lse-out", in.dir.file("l.npy")});
  expect_error(r, "k:");
  EXPECT_EQ(testing::read_file(in.out_path), "old content");
  EXPECT_THAT(in.others(), ::testing::UnorderedElementsAre("out.npy", "bad_k.npy"));
}

TEST(CliOutputs, SamePathTwiceIsAnError) {
  Inputs in;
  expect_error(run_cli(in.args({"--lse-out", in.out_path})), "is also the output of --out");
  EXPECT_THAT(in.others(), ::testing::IsEmpty());
}

TEST(CliOutputs, SuccessWritesEveryOutputAndNoTemporary) {
  Inputs in;
  const CliResult r =
      run_cli(in.args({"--lse-out", in.dir.file("l.npy"), "--weights-out", in.dir.file("w.npy")}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(in.others(), ::testing::UnorderedElementsAre("out.npy", "l.npy", "w.npy"));
  EXPECT_EQ(read_npy(in.out_path).shape(), (std::vector<std::int64_t>{1, 16, 2, 8}));
  EXPECT_EQ(read_npy(in.dir.file("w.npy")).shape(), (std::vector<std::int64_t>{1, 2, 16, 16}));
}

// ---- header text ----------------------------------------------------------------------------------

TEST(CliHeaders, NineteenDigitDimensionNamesTheFile) {
  Inputs in;
  const std::string path = in.dir.file("digits.npy");
  testing::write_file(path, testing::npy_image(1,
                                               "{'descr': '<f4', 'fortran_order': False, 'shape': "
                                               "(18446744073709551617, 8, 4, 32), }",
                                               ""));
  const CliResult r = run_cli(in.args({}, path));
  expect_error(r, path);
  EXPECT_THAT(r.err, HasSubstr("too large"));
  EXPECT_THAT(r.err, Not(HasSubstr("negative")));
}

TEST(CliHeaders, ControlBytesAreEscaped) {
  Inputs in;
  const std::string path = in.dir.file("esc.npy");
  testing::write_file(
      path, testing::npy_image(1, "{'descr': '\x1b[31mred', 'fortran_order': False, 'shape': (1,), }",
                               std::string(4, '\0')));
  const CliResult r = run_cli(in.args({}, path));
  expect_error(r, "\\x1b[31mred");
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "a raw ESC reached the terminal";
}

// ---- values the f32 kernels cannot honour ------------------------------------------------------------

TEST(CliValues, ScaleBeyondTheF32RangeIsRefused) {
  Inputs in;
  for (const char* op : {"vanilla", "flash_attn2"}) {
    std::vector<std::string> a = in.args({"--scale", "1e38"});
    a[2] = op;
    expect_error(run_cli(a), "softmax_scale");
    EXPECT_THAT(in.others(), ::testing::IsEmpty());
  }
  expect_error(run_cli(in.args({"--soft-cap", "1e39"})), "logits_soft_cap");
  expect_error(run_cli(in.args({"--soft-cap", "1e-39"})), "logits_soft_cap");
  EXPECT_EQ(run_cli(in.args({"--scale", "4"})).exit_code, 0);  // a large but honourable scale runs
}

TEST(CliValues, AbsurdThreadCountsRun) {
  Inputs in;
  const auto want = native::reference_attention_f64(make_problem(in.q, in.k, in.v, {}, {}), false);
  for (const char* n : {"100000", "2147483647"}) {
    const CliResult r = run_cli(in.args({"--threads", n, "--backend", "cpu"}));
    EXPECT_EQ(r.signal, 0);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const Tensor out = read_npy(in.out_path);
    double worst = 0;
    for (std::size_t i = 0; i < want.out.size(); ++i)
      worst = std::max(worst, std::abs(out.at(i) - want.out[i]));
    EXPECT_LE(worst, 2e-5) << n;
  }
}

}  // namespace
}  // namespace attnops::cli
