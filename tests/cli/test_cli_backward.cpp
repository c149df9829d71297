// `attnops run --dout ...` end to end: the real binary writes dq, dk, dv (and dsinks, dbias) as
// f32 .npy, equal to the library's backward; --explain ends with the backward's decision; every
// bad combination exits 2 with "error:" and writes nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "cli/inputs.h"
#include "cli/npy.h"
#include "tests/cli/cli_runner.h"

namespace attnops::cli {
namespace {

using testing::CliResult;
using ::testing::HasSubstr;
using testing::run_cli;
using ::testing::StartsWith;
using testing::TempDir;

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// q, k, v, dout (and optional sinks, bias) written to a temporary directory.
struct Inputs {
  TempDir dir;
  std::int64_t B, Tq, Tk, Hq, Hkv, D;
  Tensor q, k, v, dout, sinks, bias;
  Inputs(std::int64_t B_, std::int64_t Tq_, std::int64_t Tk_, std::int64_t Hq_, std::int64_t Hkv_,
         std::int64_t D_)
      : B(B_), Tq(Tq_), Tk(Tk_), Hq(Hq_), Hkv(Hkv_), D(D_) {
    q = random_tensor(DType::f32, {B, Tq, Hq, D}, 1);
    k = random_tensor(DType::f32, {B, Tk, Hkv, D}, 2);
    v = random_tensor(DType::f32, {B, Tk, Hkv, D}, 3);
    dout = random_tensor(DType::f32, {B, Tq, Hq, D}, 4);
    sinks = random_tensor(DType::f32, {Hq}, 5);
    bias = random_tensor(DType::f32, {1, Hq, Tq, Tk}, 6);
    for (auto [name, t] :
         {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"dout", &dout}, {"sinks", &sinks}, {"bias", &bias}})
      write_npy(path(name), *t);
  }
  std::string path(const std::string& name) const { return dir.file(name + ".npy"); }
  std::vector<std::string> args(const std::string& op, std::vector<std::string> extra) const {
    std::vector<std::string> a{"run",     "--op", op,        "--q",   path("q"),  "--k",
                               path("k"), "--v",  path("v"), "--out", path("out")};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::vector<std::string> grads(bool sinks_and_bias) const {
    std::vector<std::string> a{"--dout",   path("dout"), "--dq-out", path("dq"),
                               "--dk-out", path("dk"),   "--dv-out", path("dv")};
    if (sinks_and_bias)
      a.insert(a.end(), {"--sinks", path("sinks"), "--bias", path("bias"), "--dsinks-out", path("dsinks"),
                         "--dbias-out", path("dbias")});
    return a;
  }
};

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double d = 0;
  for (std::int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i)
    d = std::max(d, static_cast<double>(
                        std::abs(a.at(static_cast<std::size_t>(i)) - b.at(static_cast<std::size_t>(i)))));
  return d;
}

TEST(CliBackward, WritesTheLibrarysGradientsAndExplainsBothPasses) {
  Inputs in(1, 128, 128, 4, 2, 32);
  const CliResult r = run_cli(in.args("flash_attn2", [&] {
    auto a = in.grads(true);
    a.insert(a.end(), {"--backend", "cpu", "--explain"});
    return a;
  }()));
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // The same call through the library.
  OperationMetadata md = registry().entry("flash_attn2").defaults;
  md.backends = {Backend::cpu};
  const Attention attn = registry().get("flash_attn2", md);
  AttentionOptions o;
  o.sinks = in.sinks.view();
  o.bias = in.bias.view();
  o.return_lse = true;
  const AttentionOutput fwd = attn(in.q, in.k, in.v, o);
  const AttentionGradients g = attn.backward(in.q, in.k, in.v, fwd, in.dout, o);
  EXPECT_EQ(max_diff(read_npy(in.path("dq")), g.dq), 0.0);
  EXPECT_EQ(max_diff(read_npy(in.path("dk")), g.dk), 0.0);
  EXPECT_EQ(max_diff(read_npy(in.path("dv")), g.dv), 0.0);
  EXPECT_EQ(max_diff(read_npy(in.path("dsinks")), *g.dsinks), 0.0);
  EXPECT_EQ(max_diff(read_npy(in.path("dbias")), *g.dbias), 0.0);
  EXPECT_EQ(read_npy(in.path("dbias")).shape(), (std::vector<std::int64_t>{1, 4, 128, 128}));
  EXPECT_EQ(max_diff(read_npy(in.path("out")), fwd.out), 0.0);

  // --explain: the forward's decision, then the backward's on the last line.
  std::vector<std::string> lines;
  std::string line;
  for (char c : r.err) {
    if (c == '\n') {
      if (!line.empty()) lines.push_back(line);
      line.clear();
    } else {
      line += c;
    }
  }
  ASSERT_GE(lines.size(), 2u);
  const auto fj = nlohmann::json::parse(lines[lines.size() - 2]);
  const auto bj = nlohmann::json::parse(lines.back());
  EXPECT_FALSE(fj.contains("pass"));
  EXPECT_EQ(bj.value("pass", ""), "backward");
  EXPECT_EQ(bj.value("operator", ""), "flash_attn2");
  EXPECT_EQ(bj.value("backend", ""), "cpu");
}

TEST(CliBackward, GradientsAreF32ForF16Inputs) {
  Inputs in(1, 64, 64, 2, 2, 16);
  const Tensor q16 = Tensor::copy_of(in.q, DType::f16), k16 = Tensor::copy_of(in.k, DType::f16),
               v16 = Tensor::copy_of(in.v, DType::f16);
  write_npy(in.path("q"), q16);
  write_npy(in.path("k"), k16);
  write_npy(in.path("v"), v16);
  const CliResult r = run_cli(in.args("vanilla", in.grads(false)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* g : {"dq", "dk", "dv"}) EXPECT_EQ(read_npy(in.path(g)).dtype(), DType::f32) << g;
  EXPECT_EQ(read_npy(in.path("out")).dtype(), DType::f16);
}

void expect_error_and_nothing_written(const Inputs& in, const std::vector<std::string>& args,
                                      const std::string& mention) {
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, StartsWith("error:"));
  EXPECT_THAT(r.err, HasSubstr(mention));
  for (const char* f : {"out", "dq", "dk", "dv", "dsinks", "dbias"}) EXPECT_FALSE(exists(in.path(f))) << f;
}

TEST(CliBackward, BadCombinationsExitTwo) {
  Inputs in(1, 32, 32, 2, 1, 8);
  // A gradient output without --dout.
  expect_error_and_nothing_written(in, in.args("vanilla", {"--dq-out", in.path("dq")}), "--dout");
  // --dout with nothing to write.
  expect_error_and_nothing_written(in, in.args("vanilla", {"--dout", in.path("dout")}),
                                   "no gradient to write");
  // dsinks without sinks, dbias without a bias.
  expect_error_and_nothing_written(
      in, in.args("vanilla", {"--dout", in.path("dout"), "--dsinks-out", in.path("dsinks")}), "--sinks");
  expect_error_and_nothing_written(
      in, in.args("vanilla", {"--dout", in.path("dout"), "--dbias-out", in.path("dbias")}), "--bias");
  // Two outputs naming the same file.
  expect_error_and_nothing_written(
      in,
      in.args("vanilla", {"--dout", in.path("dout"), "--dq-out", in.path("dq"), "--dk-out", in.path("dq")}),
      "--dk-out");
  expect_error_and_nothing_written(
      in, in.args("vanilla", {"--dout", in.path("dout"), "--dq-out", in.path("out")}), "--dq-out");
  // dout of the wrong shape or dtype: the library's typed error, and no output file at all.
  write_npy(in.dir.file("bad_dout.npy"), random_tensor(DType::f32, {1, 32, 2, 7}, 9));
  expect_error_and_nothing_written(
      in, in.args("vanilla", {"--dout", in.dir.file("bad_dout.npy"), "--dq-out", in.path("dq")}),
      "dout: expected shape [B=1, Tq=32, Hq=2, Dv=8]");
  Tensor ints(DType::i32, {1, 32, 2, 8});
  write_npy(in.dir.file("int_dout.npy"), ints);
  expect_error_and_nothing_written(
      in, in.args("vanilla", {"--dout", in.dir.file("int_dout.npy"), "--dq-out", in.path("dq")}), "dout");
  expect_error_and_nothing_written(
      in, in.args("vanilla", {"--dout", in.dir.file("missing.npy"), "--dq-out", in.path("dq")}),
      "missing.npy");
}

TEST(CliBackward, HelpListsTheFlags) {
  const CliResult r = run_cli({"run", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* f : {"--dout", "--dq-out", "--dk-out", "--dv-out", "--dsinks-out", "--dbias-out"})
    EXPECT_THAT(r.out, HasSubstr(f));
}

// `attnops info` says which backends have a backward: native, cpu and gpu, never tpu.
TEST(CliInfoBackward, ImplementsBackwardPerBackend) {
  const CliResult r = run_cli({"info", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  ASSERT_FALSE(doc["operators"].empty());
  for (const auto& row : doc["operators"]) {
    const std::string b = row["backend"];
    // ragged_paged serves inference (paged KV caches): forward only.
    EXPECT_EQ(row["implements_backward"].get<bool>(), b != "tpu" && row["operator"] != "ragged_paged")
        << row.dump();
  }
  EXPECT_THAT(run_cli({"info"}).out, HasSubstr("backward"));
}

// `attnops bench --passes`: backward rows next to forward rows, 2.5x the FLOP count, gradient
// errors against the fp64 backward oracle, the backward's own decision.
TEST(CliBenchBackward, PassesBothGivesBackwardRows) {
  TempDir dir;
  const CliResult r = run_cli({"bench", "--ops", "blocksparse,flash_attn2", "--shapes",
                               "1,2,128,32;1,2,1:128,32", "--passes", "both", "--repeats", "1", "--sgemm",
                               "0", "--json", dir.file("b.json"), "--csv", dir.file("b.csv")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(" bwd "));
  const auto doc = nlohmann::json::parse(testing::read_file(dir.file("b.json")));
  ASSERT_EQ(doc["rows"].size(), 8u);
  int backward_rows = 0;
  for (const auto& row : doc["rows"]) {
    EXPECT_EQ(row["error"], "") << row.dump();
    EXPECT_LT(row["max_err"].get<double>(), 1e-4) << row.dump();
    EXPECT_GT(row["gflops"].get<double>(), 0) << row.dump();
    if (row["pass"] == "backward") {
      ++backward_rows;
      if (row["Tq"] == 1) {
        EXPECT_EQ(row["ran"], "vanilla") << row.dump();  // decode: the forward's fallback
      }
    }
  }
  EXPECT_EQ(backward_rows, 4);
  EXPECT_THAT(testing::read_file(dir.file("b.csv")), HasSubstr(",backward,"));
}

TEST(CliBenchBackward, FileKeyAndBadValues) {
  TempDir dir;
  testing::write_file(dir.file("b.yaml"),
                      "ops: [vanilla]\nshapes: [\"1,1,32,16\"]\npasses: backward\nrepeats: 1\nsgemm: 0\n");
  const CliResult r = run_cli({"bench", "--file", dir.file("b.yaml")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(" bwd "));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr(" fwd ")));
  testing::write_file(dir.file("bad.yaml"), "passes: [sideways]\n");
  for (const std::vector<std::string>& args : {std::vector<std::string>{"bench", "--passes", "sideways"},
                                               {"bench", "--file", dir.file("bad.yaml")}}) {
    const CliResult bad = run_cli(args);
    EXPECT_EQ(bad.exit_code, 2) << bad.err;
    EXPECT_THAT(bad.err, StartsWith("error:"));
    EXPECT_THAT(bad.err, HasSubstr("passes"));
  }
}

// Backward rows on the gpu (lavapipe allowed, validation on): the backward ran there, its
// gradients match the oracle, and the kernels alone are timed from GPU timestamps.
TEST(CliBenchBackward, GpuRowsRunTheVulkanBackward) {
  TempDir dir;
  const CliResult r =
      run_cli({"bench", "--ops", "flash_attn2", "--backends", "gpu", "--shapes", "1,2,64,32", "--passes",
               "backward", "--repeats", "1", "--sgemm", "0", "--json", dir.file("b.json")},
              {{"ATTNOPS_VK_ALLOW_SOFTWARE", "1"}, {"ATTNOPS_VK_VALIDATION", "1"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto doc = nlohmann::json::parse(testing::read_file(dir.file("b.json")));
  ASSERT_EQ(doc["rows"].size(), 1u);
  const auto& row = doc["rows"][0];
  if (row["backend"] != "gpu") GTEST_SKIP() << "no Vulkan device: " << row.dump();
  EXPECT_EQ(row["pass"], "backward") << row.dump();
  EXPECT_EQ(row["error"], "") << row.dump();
  EXPECT_LT(row["max_err"].get<double>(), 1e-4) << row.dump();
  EXPECT_GT(row["kernel_ms"].get<double>(), 0) << row.dump();
}

}  // namespace
}  // namespace attnops::cli
