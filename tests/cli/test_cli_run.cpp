// `attnops run` end to end: the real binary on .npy files this test writes, each flag checked
// against the fp64 oracle (or the library called directly), the --explain JSON for each
// fallback and for unavailable backends, ATTNOPS_LOG=dispatch, and exit status 2 with an
// "error:" message for every usage error and malformed file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
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
using testing::run_cli;
using ::testing::StartsWith;
using testing::TempDir;

// q, k, v written to a temporary directory, kept in memory for the oracle.
struct Inputs {
  TempDir dir;
  Tensor q, k, v;
  std::string q_path = dir.file("q.npy"), k_path = dir.file("k.npy"), v_path = dir.file("v.npy");
  std::string out_path = dir.file("out.npy");

  Inputs(std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D,
         DType dtype = DType::f32, std::uint64_t seed = 1) {
    q = random_tensor(dtype, {B, Tq, Hq, D}, seed);
    k = random_tensor(dtype, {B, Tk, Hkv, D}, seed + 1);
    v = random_tensor(dtype, {B, Tk, Hkv, D}, seed + 2);
    write_npy(q_path, q);
    write_npy(k_path, k);
    write_npy(v_path, v);
  }
  // "run --op OP --q .. --k .. --v .. --out .." followed by `extra`.
  std::vector<std::string> args(const std::string& op, std::vector<std::string> extra = {}) const {
    std::vector<std::string> a{"run",  "--op", op,     "--q",   q_path,  "--k",
                               k_path, "--v",  v_path, "--out", out_path};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string save(const std::string& name, const TensorView& t) const {
    write_npy(dir.file(name), t);
    return dir.file(name);
  }
};

double max_abs_diff(const Tensor& got, const std::vector<double>& want) {
  EXPECT_EQ(static_cast<std::size_t>(got.numel()), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size() && i < static_cast<std::size_t>(got.numel()); ++i) {
    const double a = got.at(i), b = want[i];
    if (std::isinf(b) && a == b) continue;  // -inf lse of an empty row
    worst = std::max(worst, std::abs(a - b));
    if (std::isnan(a)) return INFINITY;
  }
  return worst;
}

native::ReferenceResult oracle(const Inputs& in, const AttentionOptions& o, const OperationMetadata& md = {},
                               bool weights = false) {
  return native::reference_attention_f64(make_problem(in.q, in.k, in.v, o, md), weights);
}

void expect_ok(const CliResult& r) {
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Runs `args` and checks the written output against the oracle for options `o`.
void check_run(const Inputs& in, const std::vector<std::string>& args, const AttentionOptions& o,
               const OperationMetadata& md = {}, double tol = 2e-5, DType want_dtype = DType::f32) {
  const CliResult r = run_cli(args);
  expect_ok(r);
  if (r.exit_code != 0) return;
  const Tensor out = read_npy(in.out_path);
  EXPECT_EQ(out.dtype(), want_dtype);
  EXPECT_LE(max_abs_diff(out, oracle(in, o, md).out), tol);
}

nlohmann::json explain_json(const CliResult& r) {
  try {
    return nlohmann::json::parse(r.last_err_line());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "last stderr line is not JSON: '" << r.last_err_line() << "' (" << e.what() << ")";
    return {};
  }
}

std::vector<std::string> reason_codes(const nlohmann::json& j) {
  std::vector<std::string> codes;
  if (j.contains("reasons"))
    for (const auto& x : j["reasons"]) codes.push_back(x.value("code", ""));
  return codes;
}

// ---- each flag ----------------------------------------------------------------------------------

TEST(CliRun, DefaultIsCausalAndMatchesLibraryAndOracle) {
  Inputs in(2, 128, 128, 4, 2, 32);
  check_run(in, in.args("vanilla"), AttentionOptions{});
  // The same call through the library directly gives the same output.
  const AttentionOutput direct = registry().get("vanilla")(in.q, in.k, in.v, {});
  const Tensor out = read_npy(in.out_path);
  double diff = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(out.numel()); ++i)
    diff = std::max(diff, static_cast<double>(std::abs(out.at(i) - direct.out.at(i))));
  EXPECT_LE(diff, 1e-6);
}

TEST(CliRun, ExplicitCausalAndNoCausal) {
  Inputs in(1, 128, 128, 2, 2, 32);
  check_run(in, in.args("flash_attn2", {"--causal"}), AttentionOptions{});
  AttentionOptions nc;
  nc.causal = false;
  check_run(in, in.args("flash_attn2", {"--no-causal"}), nc);
}

TEST(CliRun, Scale) {
  Inputs in(1, 64, 64, 2, 1, 16);
  OperationMetadata md;
  md.softmax_scale = 0.7;
  check_run(in, in.args("vanilla", {"--scale", "0.7"}), AttentionOptions{}, md);
}

TEST(CliRun, Window) {
  Inputs in(1, 256, 256, 2, 1, 32);
  AttentionOptions o;
  o.sliding_window = Window{16, 0};
  check_run(in, in.args("blocksparse", {"--window", "16,0"}), o);
}

TEST(CliRun, Chunk) {
  Inputs in(1, 128, 128, 2, 2, 32);
  AttentionOptions o;
  o.chunk_size = 32;
  check_run(in, in.args("blocksparse", {"--chunk", "32"}), o);
}

TEST(CliRun, SoftCap) {
  Inputs in(1, 128, 128, 2, 2, 32, DType::f32, 5);
  AttentionOptions o;
  o.logits_soft_cap = 2.0;
  check_run(in, in.args("flash_attn2", {"--soft-cap", "2"}), o);
}

TEST(CliRun, Sinks) {
  Inputs in(1, 128, 128, 4, 2, 32);
  const Tensor sinks = random_tensor(DType::f32, {4}, 9);
  AttentionOptions o;
  o.sinks = sinks.view();
  check_run(in, in.args("blocksparse", {"--sinks", in.save("sinks.npy", sinks)}), o);
}

TEST(CliRun, Bias) {
  Inputs in(1, 40, 50, 2, 2, 16);
  const Tensor bias = random_tensor(DType::f32, {1, 2, 40, 50}, 4);
  AttentionOptions o;
  o.causal = false;
  o.bias = bias.view();
  check_run(in, in.args("vanilla", {"--no-causal", "--bias", in.save("bias.npy", bias)}), o);
}

TEST(CliRun, SegmentIds) {
  Inputs in(1, 128, 128, 2, 2, 16);
  Tensor seg(DType::i32, {1, 128});
  for (int i = 0; i < 128; ++i) seg.data_as<std::int32_t>()[i] = i / 50;
  AttentionOptions o;
  o.segment_ids_q = seg.view();
  o.segment_ids_kv = seg.view();
  const std::string s = in.save("seg.npy", seg);
  check_run(in, in.args("blocksparse", {"--segment-ids-q", s, "--segment-ids-kv", s}), o);
}

TEST(CliRun, F16InputGivesF16Output) {
  Inputs in(1, 128, 128, 2, 2, 32, DType::f16);
  check_run(in, in.args("flash_attn2"), AttentionOptions{}, {}, 2e-3, DType::f16);
}

TEST(CliRun, DtypeFlag) {
  Inputs in(1, 64, 64, 2, 2, 32);
  OperationMetadata md;
  md.runtime_dtype = DType::f16;
  check_run(in, in.args("vanilla", {"--dtype", "f16"}), AttentionOptions{}, md, 2e-3, DType::f16);
  md.runtime_dtype = DType::bf16;  // .npy has no bf16: written as f32
  check_run(in, in.args("vanilla", {"--dtype", "bf16"}), AttentionOptions{}, md, 1.6e-2, DType::f32);
}

TEST(CliRun, LseAndWeights) {
  Inputs in(1, 33, 47, 2, 1, 16);
  const std::string lse = in.dir.file("lse.npy"), w = in.dir.file("w.npy");
  expect_ok(run_cli(in.args("vanilla", {"--lse-out", lse, "--weights-out", w})));
  const auto ref = oracle(in, {}, {}, true);
  const Tensor got_lse = read_npy(lse), got_w = read_npy(w);
  EXPECT_EQ(got_lse.shape(), (std::vector<std::int64_t>{1, 2, 33}));
  EXPECT_EQ(got_w.shape(), (std::vector<std::int64_t>{1, 2, 33, 47}));
  EXPECT_LE(max_abs_diff(got_lse, ref.lse), 1e-4);
  EXPECT_LE(max_abs_diff(got_w, ref.weights), 1e-5);
}

TEST(CliRun, ThreadsAndBackendChoice) {
  Inputs in(1, 128, 128, 2, 2, 32);
  for (const char* b : {"native", "cpu"}) {
    const CliResult r = run_cli(in.args("flash_attn2", {"--threads", "1", "--backend", b, "--explain"}));
    expect_ok(r);
    EXPECT_EQ(explain_json(r).value("backend", ""), b);
    // The flags are the call's own settings, and the decision shows them.
    const nlohmann::json settings = {{"num_threads", 1}, {"backends", nlohmann::json::array({b})}};
    EXPECT_EQ(explain_json(r).value("settings", nlohmann::json()), settings) << explain_json(r).dump();
    EXPECT_LE(max_abs_diff(read_npy(in.out_path), oracle(in, {}).out), 2e-5) << b;
  }
}

TEST(CliRun, ConfigFileAppliesAndFlagsOverrideIt) {
  Inputs in(1, 64, 64, 2, 2, 16);
  const std::string cfg = in.dir.file("c.yaml");
  testing::write_file(cfg, "softmax_scale: 0.5\nbackend: native\n");
  OperationMetadata md;
  md.softmax_scale = 0.5;
  check_run(in, in.args("vanilla", {"--config", cfg}), AttentionOptions{}, md);
  md.softmax_scale = 0.9;  // the flag wins over the file
  check_run(in, in.args("vanilla", {"--config", cfg, "--scale", "0.9"}), AttentionOptions{}, md);
  const CliResult r = run_cli(in.args("vanilla", {"--config", cfg, "--backend", "cpu", "--explain"}));
  expect_ok(r);
  EXPECT_EQ(explain_json(r).value("backend", ""), "cpu");
}

// ---- --explain and the dispatch log ------------------------------------------------------------

TEST(CliExplain, NoFallback) {
  Inputs in(1, 128, 128, 2, 2, 32);
  const CliResult r = run_cli(in.args("blocksparse", {"--explain"}));
  expect_ok(r);
  const auto j = explain_json(r);
  EXPECT_EQ(j.value("requested", ""), "blocksparse");
  EXPECT_EQ(j.value("operator", ""), "blocksparse");
  EXPECT_THAT(reason_codes(j), ::testing::Not(::testing::Contains("decode")));
}

struct FallbackCase {
  const char* op;
  std::int64_t Tq, Tk;
  bool causal;
  const char* code;
};

class CliFallback : public ::testing::TestWithParam<FallbackCase> {};

TEST_P(CliFallback, ExplainNamesTheReason) {
  const FallbackCase c = GetParam();
  Inputs in(1, c.Tq, c.Tk, 4, 2, 32);
  const CliResult r = run_cli(in.args(c.op, {c.causal ? "--causal" : "--no-causal", "--explain"}));
  expect_ok(r);
  const auto j = explain_json(r);
  EXPECT_EQ(j.value("requested", ""), c.op);
  EXPECT_EQ(j.value("operator", ""), "vanilla");
  EXPECT_THAT(reason_codes(j), ::testing::Contains(c.code));
  AttentionOptions o;
  o.causal = c.causal;
  EXPECT_LE(max_abs_diff(read_npy(in.out_path), oracle(in, o).out), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Codes, CliFallback,
                         ::testing::Values(FallbackCase{"blocksparse", 1, 200, true, "decode"},
                                           FallbackCase{"flash_attn2", 1, 200, true, "decode"},
                                           FallbackCase{"blocksparse", 128, 128, false, "non_causal"},
                                           FallbackCase{"blocksparse", 100, 100, true, "seq_multiple"}),
                         [](const auto& info) { return std::string(info.param.op) + "_" + info.param.code; });

TEST(CliExplain, TpuIsUnavailable) {
  Inputs in(1, 16, 16, 2, 2, 16);
  const CliResult r = run_cli(in.args("vanilla", {"--backend", "tpu", "--explain"}));
  expect_ok(r);
  const auto j = explain_json(r);
  EXPECT_NE(j.value("backend", ""), "tpu");
  EXPECT_THAT(reason_codes(j), ::testing::Contains("backend_unavailable"));
}

TEST(CliExplain, GpuWithoutQualifyingDeviceIsUnavailable) {
  ::unsetenv("ATTNOPS_VK_ALLOW_SOFTWARE");
  ::unsetenv("ATTNOPS_VK_DEVICE");
  if (registry().host().availability(Backend::gpu, GpuSettings{}).available)
    GTEST_SKIP() << "a Vulkan device qualifies on this host";
  Inputs in(1, 16, 16, 2, 2, 16);
  const CliResult r = run_cli(in.args("flash_attn2", {"--backend", "gpu", "--explain"}));
  expect_ok(r);
  const auto j = explain_json(r);
  EXPECT_NE(j.value("backend", ""), "gpu");
  ASSERT_FALSE(j["reasons"].empty());
  EXPECT_EQ(j["reasons"][0].value("code", ""), "backend_unavailable");
  EXPECT_THAT(j["reasons"][0].value("detail", ""), HasSubstr("gpu"));
}

TEST(CliExplain, DispatchLogLine) {
  Inputs in(1, 1, 64, 2, 2, 16);
  const CliResult r = run_cli(in.args("blocksparse", {"--explain"}), {{"ATTNOPS_LOG", "dispatch"}});
  expect_ok(r);
  EXPECT_THAT(r.err, HasSubstr("attnops,dispatch,blocksparse->vanilla,"));
  EXPECT_THAT(r.err, HasSubstr("decode:"));
  EXPECT_EQ(explain_json(r).value("operator", ""), "vanilla");  // still the last line
  // Without the variable, nothing but the JSON.
  const CliResult quiet = run_cli(in.args("blocksparse", {"--explain"}));
  EXPECT_THAT(quiet.err, ::testing::Not(HasSubstr("attnops,dispatch")));
}

// ---- errors: exit 2, "error:" on stderr, never a signal ---------------------------------------

void expect_usage_error(const std::vector<std::string>& args, const std::string& mention = "") {
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 2) << "stderr: " << r.err;
  EXPECT_THAT(r.err, StartsWith("error:"));
  if (!mention.empty()) {
    EXPECT_THAT(r.err, HasSubstr(mention));
  }
}

TEST(CliErrors, UsageErrors) {
  Inputs in(1, 16, 16, 2, 2, 16);
  expect_usage_error({});
  expect_usage_error({"frobnicate"});
  expect_usage_error({"run", "--q", in.q_path, "--k", in.k_path, "--v", in.v_path, "--out", in.out_path},
                     "--op");
  expect_usage_error(in.args("vanilla", {"--bogus"}), "--bogus");
  expect_usage_error(in.args("vanilla", {"--causal", "--no-causal"}));
  expect_usage_error(in.args("vanilla", {"--backend", "quantum"}));
  expect_usage_error(in.args("vanilla", {"--dtype", "f64"}));
  expect_usage_error(in.args("vanilla", {"--scale", "abc"}));
  expect_usage_error(in.args("vanilla", {"--threads", "-1"}));
  expect_usage_error(in.args("vanilla", {"--window", "3"}), "--window");
  expect_usage_error(in.args("vanilla", {"--window", "a,b"}), "--window");
  expect_usage_error(in.args("vanilla", {"--segment-ids-q", in.q_path}), "--segment-ids-kv");
  expect_usage_error(in.args("no_such_op"), "no_such_op");
  expect_usage_error(in.args("vanilla", {"--scale", "nan"}), "scale");
  expect_usage_error(in.args("vanilla", {"--chunk", "0"}));
  expect_usage_error(in.args("vanilla", {"--config", in.dir.file("missing.yaml")}), "missing.yaml");
}

TEST(CliErrors, HelpExitsZero) {
  const CliResult r = run_cli({"run", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--explain"));
}

TEST(CliErrors, BadInputs) {
  Inputs in(1, 16, 16, 2, 2, 16);
  const std::string bad_k = in.save("bad_k.npy", random_tensor(DType::f32, {1, 16, 2, 8}, 3));
  expect_usage_error(
      {"run", "--op", "vanilla", "--q", in.q_path, "--k", bad_k, "--v", in.v_path, "--out", in.out_path},
      "k");
  expect_usage_error(in.args("vanilla", {"--sinks", in.save("s.npy", random_tensor(DType::f32, {3}, 1))}));
  expect_usage_error({"run", "--op", "vanilla", "--q", in.dir.file("none.npy"), "--k", in.k_path, "--v",
                      in.v_path, "--out", in.out_path},
                     "none.npy");
  expect_usage_error({"run", "--op", "vanilla", "--q", in.q_path, "--k", in.k_path, "--v", in.v_path, "--out",
                      in.dir.file("no/such/dir/out.npy")},
                     "out.npy");
  const std::string cfg = in.dir.file("bad.yaml");
  testing::write_file(cfg, "softmax_scale: [1, 2\n");
  expect_usage_error(in.args("vanilla", {"--config", cfg}), "bad.yaml");
}

// Each malformed .npy as --q: exit 2 with a message naming the file.
class CliMalformed : public ::testing::TestWithParam<std::pair<const char*, std::string>> {};

std::string npy_image(const std::string& header, const std::string& data) {
  return testing::npy_image(1, header, data);
}

TEST_P(CliMalformed, ExitsTwoNamingTheFile) {
  Inputs in(1, 2, 2, 1, 1, 2);
  const std::string path = in.dir.file(std::string(GetParam().first) + ".npy");
  testing::write_file(path, GetParam().second);
  expect_usage_error(
      {"run", "--op", "vanilla", "--q", path, "--k", in.k_path, "--v", in.v_path, "--out", in.out_path},
      path);
}

const std::string kData16(16, '\0');
INSTANTIATE_TEST_SUITE_P(
    Files, CliMalformed,
    ::testing::Values(
        std::make_pair("fortran",
                       npy_image("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2, 1, 2), }",
                                 kData16)),
        std::make_pair("big_endian",
                       npy_image("{'descr': '>f4', 'fortran_order': False, 'shape': (1, 2, 1, 2), }",
                                 kData16)),
        std::make_pair("complex",
                       npy_image("{'descr': '<c8', 'fortran_order': False, 'shape': (1, 2, 1, 1), }",
                                 kData16)),
        std::make_pair("header_lies", std::string("\x93NUMPY\x01\x00\xff\x7f{'descr': '<f4'}", 25)),
        std::make_pair(
            "overflow",
            npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 8, 1, 1), }",
                      kData16)),
        std::make_pair("size_mismatch",
                       npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 2), }",
                                 kData16)),
        std::make_pair("truncated",
                       npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 1, 20), }",
                                 kData16)),
        std::make_pair("garbage", std::string("PK\x03\x04 this is a zip file, not an array")),
        std::make_pair("empty", std::string())),
    [](const auto& info) { return std::string(info.param.first); });

// The first real GPU showed processes dying at exit after a correct run: `attnops run --backend
// gpu` must exit 0 (validation on), and --explain reports where the data was and, with
// --profile, the timings.
TEST(CliRunGpu, RunsOnTheGpuAndExitsZero) {
  const Inputs in(1, 40, 56, 4, 2, 32);
  const CliResult r = run_cli(in.args("flash_attn2", {"--backend", "gpu", "--explain", "--profile"}),
                              {{"ATTNOPS_VK_ALLOW_SOFTWARE", "1"}, {"ATTNOPS_VK_VALIDATION", "1"}});
  expect_ok(r);
  const auto j = nlohmann::json::parse(r.last_err_line());
  if (j["backend"] != "gpu") GTEST_SKIP() << "no Vulkan device: " << r.last_err_line();
  EXPECT_EQ(j["inputs"], "host");
  EXPECT_EQ(j["output"], "host");
  EXPECT_GT(j["bytes_to_device"].get<double>(), 0);
  EXPECT_EQ(j["bytes_to_host"].get<double>(), 40.0 * 4 * 32 * 4);
  ASSERT_TRUE(j.contains("timings")) << r.last_err_line();
  EXPECT_GT(j["timings"]["wall_ms"].get<double>(), 0);
  // The output is right.
  const Tensor out = read_npy(in.out_path);
  const auto want = oracle(in, AttentionOptions{});
  EXPECT_LT(max_abs_diff(out, want.out), 2e-5);
  // Without validation too, and with the staging path.
  const CliResult r2 = run_cli(in.args("vanilla", {"--backend", "gpu"}),
                               {{"ATTNOPS_VK_ALLOW_SOFTWARE", "1"}, {"ATTNOPS_VK_FORCE_STAGING", "1"}});
  expect_ok(r2);
}

}  // namespace
}  // namespace attnops::cli
