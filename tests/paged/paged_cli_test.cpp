// `attnops run --op ragged_paged` and `attnops bench` serving rows, through the real binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/npy.h"
#include "tests/cli/cli_runner.h"
#include "tests/paged/paged_cases.h"

namespace attnops::testing {
namespace {

using cli::testing::CliResult;
using cli::testing::run_cli;
using cli::testing::TempDir;
using ::testing::HasSubstr;

// A case's inputs as .npy files.
struct Files {
  TempDir dir;
  std::string q = dir.file("q.npy"), kp = dir.file("kp.npy"), vp = dir.file("vp.npy"),
              pt = dir.file("pt.npy"), cu = dir.file("cu.npy"), kl = dir.file("kl.npy"),
              out = dir.file("o.npy"), lse = dir.file("l.npy");
  explicit Files(const PagedCase& c) {
    cli::write_npy(q, c.q);
    cli::write_npy(kp, c.cache.k_pages());
    cli::write_npy(vp, c.cache.v_pages());
    cli::write_npy(pt, c.table);
    cli::write_npy(cu, c.cu);
    cli::write_npy(kl, c.kv);
  }
  std::vector<std::string> args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> a{
        "run",          "--op", "ragged_paged",   "--q", q,           "--k-pages", kp,      "--v-pages", vp,
        "--page-table", pt,     "--cu-seqlens-q", cu,    "--kv-lens", kl,          "--out", out};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

bool exists(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f) std::fclose(f);
  return f != nullptr;
}

TEST(PagedCli, RunWritesTheLibrarysResult) {
  PagedCaseSpec s;
  s.q_lens = {1, 5, 0, 9}, s.kv_lens = {70, 12, 3, 9}, s.page_size = 8, s.sinks = false;
  s.window = Window{20, 0};
  const PagedCase c = make_paged_case(s);
  const Files f(c);
  const CliResult r = run_cli(
      f.args({"--lse-out", f.lse, "--window", "20,0", "--backend", "cpu", "--threads", "1", "--explain"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.last_err_line(), HasSubstr("\"operator\": \"ragged_paged\""));
  EXPECT_THAT(r.last_err_line(), HasSubstr("\"batch_invariant\": true"));
  OperationMetadata md;
  md.num_threads = 2;  // batch invariance: any thread count gives these bits
  const AttentionOutput want = run_paged(c, Backend::cpu, md);
  EXPECT_TRUE(same_bits(cli::read_npy(f.out), want.attention_outputs));
  EXPECT_TRUE(same_bits(cli::read_npy(f.lse), *want.lse));
}

// --backend gpu (lavapipe here: allowed through the environment, validation on): the pools are
// uploaded, the run exits 0 and writes the library's gpu result bit for bit (one device, one
// kernel), through mapped memory and through the staging copies alike.
TEST(PagedCli, RunOnTheGpu) {
  GpuSettings gpu;
  gpu.allow_software = true;
  if (!registry().host().availability(Backend::gpu, gpu).available) GTEST_SKIP() << "no Vulkan device here";
  PagedCaseSpec s;
  s.q_lens = {1, 5, 0, 9}, s.kv_lens = {70, 12, 3, 9}, s.page_size = 8, s.dtype = DType::f16;
  s.window = Window{20, 0};
  const PagedCase c = make_paged_case(s);
  const Files f(c);
  OperationMetadata md;
  md.gpu = gpu;
  const AttentionOutput want = run_paged(c, Backend::gpu, md);
  ASSERT_EQ(want.decision.backend, Backend::gpu) << want.decision.to_json();
  for (const char* staging : {"0", "1"}) {
    const CliResult r =
        run_cli(f.args({"--lse-out", f.lse, "--window", "20,0", "--backend", "gpu", "--explain"}),
                {{"ATTNOPS_VK_ALLOW_SOFTWARE", "1"},
                 {"ATTNOPS_VK_VALIDATION", "1"},
                 {"ATTNOPS_VK_FORCE_STAGING", staging}});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.last_err_line());
    EXPECT_EQ(j["backend"], "gpu") << r.last_err_line();
    EXPECT_EQ(j["kernel"], "paged_rowwise") << r.last_err_line();
    EXPECT_EQ(j["batch_invariant"], true);
    EXPECT_TRUE(same_bits(cli::read_npy(f.out), want.attention_outputs)) << "staging " << staging;
    EXPECT_TRUE(same_bits(cli::read_npy(f.lse), *want.lse)) << "staging " << staging;
  }
}

TEST(PagedCli, BadInputsExitTwoAndWriteNothing) {
  PagedCaseSpec s;
  s.q_lens = {1, 2}, s.kv_lens = {10, 4};
  const PagedCase c = make_paged_case(s);
  const Files f(c);
  // A missing paged input, a dense-only flag, a decreasing cu_seqlens_q.
  std::vector<std::string> no_kl = f.args();
  no_kl.erase(no_kl.begin() + 13, no_kl.begin() + 15);
  const CliResult a = run_cli(no_kl);
  EXPECT_EQ(a.exit_code, 2);
  EXPECT_THAT(a.err, HasSubstr("--kv-lens is required"));
  const CliResult b = run_cli(f.args({"--bias", f.q}));
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_THAT(b.err, HasSubstr("--bias has no form in a paged run"));
  Tensor bad_cu = Tensor::copy_of(c.cu);
  bad_cu.data_as<std::int32_t>()[1] = 3;  // cu = [0, 3, 3]: fine; [0, 3, 1] decreasing
  bad_cu.data_as<std::int32_t>()[2] = 1;
  cli::write_npy(f.cu, bad_cu);
  const CliResult d = run_cli(f.args({"--lse-out", f.lse}));
  EXPECT_EQ(d.exit_code, 2);
  EXPECT_THAT(d.err, HasSubstr("cu_seqlens_q: decreasing"));
  EXPECT_FALSE(exists(f.out));
  EXPECT_FALSE(exists(f.lse));
  // Without paged inputs, a dense run still needs --k and --v.
  const CliResult e = run_cli({"run", "--op", "vanilla", "--q", f.q, "--out", f.out});
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_THAT(e.err, HasSubstr("--k is required"));
}

// --num-seqs counts sequences: -1 (the default) means all, any other negative is refused.
TEST(PagedCli, NegativeNumSeqsIsRefused) {
  PagedCaseSpec s;
  s.q_lens = {1, 2}, s.kv_lens = {10, 4};
  const PagedCase c = make_paged_case(s);
  const Files f(c);
  const CliResult r = run_cli(f.args({"--num-seqs", "-5", "--backend", "cpu"}));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error: --num-seqs: "));
  EXPECT_FALSE(exists(f.out));
  const CliResult all = run_cli(f.args({"--num-seqs", "-1", "--backend", "cpu"}));
  EXPECT_EQ(all.exit_code, 0) << all.err;
}

// Serving rows are sized before anything is allocated, as dense rows are: a row whose page ids
// do not fit the page table's int32, or whose tensors need more than the machine's memory, ends
// the bench before any timing with an error naming the row.
TEST(PagedCli, BenchServingRowsAreSizedBeforeAllocating) {
  TempDir dir;
  const std::string head = "backends: [cpu]\ndtypes: [f32]\nrepeats: 1\nread_bandwidth_mib: 16\nserving:\n";
  cli::testing::write_file(
      dir.file("ids.yaml"),
      head +
          "  - {label: small, seqs: 1, kv_len: 64, heads: [1, 1], head_dim: 8}\n"
          "  - {label: many_pages, seqs: 65536, kv_len: 65536, heads: [1, 1], head_dim: 1,"
          " page_size: 1}\n");
  cli::testing::CliOptions guard;  // without the checks the program would fill the machine: ended
  guard.timeout_seconds = 120;
  const CliResult a = cli::testing::run_cli_with({"bench", "--file", dir.file("ids.yaml")}, guard);
  EXPECT_EQ(a.exit_code, 2) << a.err;
  EXPECT_THAT(a.err, HasSubstr("serving row 'many_pages' page 1"));
  EXPECT_THAT(a.err, HasSubstr("4294967296 pages"));
  EXPECT_THAT(a.out, ::testing::Not(HasSubstr("read bandwidth"))) << "timed before the check";
  cli::testing::write_file(
      dir.file("big.yaml"),
      head +
          "  - {label: small, seqs: 1, kv_len: 64, heads: [1, 1], head_dim: 8}\n"
          "  - {label: huge_pools, seqs: 64, kv_len: 1048576, heads: [64, 64], head_dim: "
          "256, page_size: 64}\n");
  const CliResult b = cli::testing::run_cli_with({"bench", "--file", dir.file("big.yaml")}, guard);
  EXPECT_EQ(b.exit_code, 2) << b.err;
  EXPECT_THAT(b.err, HasSubstr("serving row 'huge_pools' page 64 f32 needs at least"));
  EXPECT_THAT(b.err, HasSubstr("[out_of_memory]"));
  EXPECT_THAT(b.out, ::testing::Not(HasSubstr("read bandwidth"))) << "timed before the check";
}

// A row that fits the machine but not the process (here: an address-space limit of 256 MiB, which
// `attnops bench` with small rows runs within; the first row's page ids alone need 512 MiB) fails
// alone, reported in its row as dense rows report theirs; the next row runs.
constexpr long long kAddressSpaceLimit = 256ll << 20;
TEST(PagedCli, BenchServingRowThatCannotAllocateFailsAlone) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers reserve address space; RLIMIT_AS cannot be lowered under them";
#endif
  TempDir dir;
  cli::testing::write_file(
      dir.file("s.yaml"),
      "backends: [cpu]\ndtypes: [f16]\nrepeats: 1\nread_bandwidth_mib: 16\nserving:\n"
      "  - {label: over_the_limit, seqs: 8192, kv_len: 16384, heads: [1, 1], head_dim: 1, page_size: 1}\n"
      "  - {label: small, seqs: 2, kv_len: 64, heads: [2, 1], head_dim: 8}\n");
  cli::testing::CliOptions o;
  o.address_space_limit = kAddressSpaceLimit;
  const CliResult r = cli::testing::run_cli_with(
      {"bench", "--file", dir.file("s.yaml"), "--serving-json", dir.file("s.json"), "--threads", "1"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto doc = nlohmann::json::parse(cli::testing::read_file(dir.file("s.json")));
  ASSERT_EQ(doc["rows"].size(), 2u);
  EXPECT_THAT(doc["rows"][0]["error"].get<std::string>(), HasSubstr("out_of_memory"))
      << doc["rows"][0].dump();
  EXPECT_EQ(doc["rows"][1]["error"], "") << doc["rows"][1].dump();
  EXPECT_GT(doc["rows"][1]["tokens_per_s"].get<double>(), 0) << doc["rows"][1].dump();
}

TEST(PagedCli, BenchServingRows) {
  TempDir dir;
  cli::testing::write_file(
      dir.file("s.yaml"),
      "backends: [cpu]\ndtypes: [f32]\nrepeats: 1\nread_bandwidth_mib: 16\nserving:\n"
      "  - {label: tiny, seqs: 3, kv_len: [5, 90], q_len: 1, prefill: {fraction: 0.34, q_len: 40},"
      " heads: [4, 2], head_dim: 16, page_size: [4, 16]}\n");
  const CliResult r = run_cli({"bench", "--file", dir.file("s.yaml"), "--serving-json", dir.file("s.json")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("read bandwidth"));
  EXPECT_THAT(r.out, HasSubstr("tiny"));
  const auto doc = nlohmann::json::parse(cli::testing::read_file(dir.file("s.json")));
  EXPECT_GT(doc["read_bandwidth"]["gbps"].get<double>(), 0);
  ASSERT_EQ(doc["rows"].size(), 2u);
  for (const auto& row : doc["rows"]) {
    EXPECT_EQ(row["error"], "") << row.dump();
    EXPECT_EQ(row["backend"], "cpu") << row.dump();
    EXPECT_GT(row["kv_gbps"].get<double>(), 0) << row.dump();
    EXPECT_GT(row["tokens_per_s"].get<double>(), 0) << row.dump();
    EXPECT_LT(row["max_err"].get<double>(), 1e-5) << row.dump();
  }
  // gpu_resident (lavapipe here): the pools and q on the device during the timing.
  GpuSettings gpu;
  gpu.allow_software = true;
  if (registry().host().availability(Backend::gpu, gpu).available) {
    cli::testing::write_file(
        dir.file("g.yaml"),
        "backends: [gpu_resident, gpu]\ndtypes: [f16]\nrepeats: 1\nread_bandwidth_mib: 16\n"
        "serving:\n  - {label: tiny, seqs: 3, kv_len: [5, 90], q_len: 1, prefill: {fraction: "
        "0.34, q_len: 40}, heads: [4, 2], head_dim: 16, page_size: 4}\n");
    const CliResult g = run_cli({"bench", "--file", dir.file("g.yaml"), "--serving-json", dir.file("g.json")},
                                {{"ATTNOPS_VK_ALLOW_SOFTWARE", "1"}});
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const auto gdoc = nlohmann::json::parse(cli::testing::read_file(dir.file("g.json")));
    ASSERT_EQ(gdoc["rows"].size(), 2u);
    for (const auto& row : gdoc["rows"]) {
      EXPECT_EQ(row["error"], "") << row.dump();
      EXPECT_EQ(row["backend"], "gpu") << row.dump();
      EXPECT_EQ(row["kernel"], "paged_rowwise") << row.dump();
      EXPECT_LT(row["max_err"].get<double>(), 2e-3) << row.dump();
    }
  }
  // A wrong key names the file, the line and the key.
  cli::testing::write_file(dir.file("bad.yaml"), "serving:\n  - {seqs: 0}\n");
  const CliResult b = run_cli({"bench", "--file", dir.file("bad.yaml")});
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_THAT(b.err, HasSubstr("bad.yaml:2:"));
  EXPECT_THAT(b.err, HasSubstr("serving: seqs"));
}

}  // namespace
}  // namespace attnops::testing
