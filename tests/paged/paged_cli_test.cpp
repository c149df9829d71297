// `attnops run --op ragged_paged` and `attnops bench` serving rows, through the real binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
  EXPECT_TRUE(same_bits(cli::read_npy(f.out), want.out));
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
    EXPECT_EQ(j["kernel"], "paged_decode") << r.last_err_line();  // decode rows: the decode kernel
    EXPECT_EQ(j["batch_invariant"], true);
    EXPECT_TRUE(same_bits(cli::read_npy(f.out), want.out)) << "staging " << staging;
    EXPECT_TRUE(same_bits(cli::read_npy(f.lse), *want.lse)) << "staging " << staging;
  }
}

// 8-bit caches: page files of codes with their scales (int8 '|i1', e4m3 '|u1'), and float page
// files quantized on load (--kv-dtype): the library's result bit for bit.
TEST(PagedCli, EightBitPagesAndQuantizingOnLoad) {
  for (DType kv : {DType::i8, DType::fp8_e4m3})
    for (KVScales kind : {KVScales::per_token, KVScales::per_tensor}) {
      PagedCaseSpec s;
      s.q_lens = {1, 5, 0, 9}, s.kv_lens = {70, 12, 3, 9}, s.page_size = 8;
      s.kv_dtype = kv, s.scales = kind;
      const PagedCase c = make_paged_case(s);
      SCOPED_TRACE(s.describe());
      const Files f(c);
      const std::string ks = f.dir.file("ks.npy"), vs = f.dir.file("vs.npy");
      cli::write_npy(ks, c.cache.k_scales());
      cli::write_npy(vs, c.cache.v_scales());
      std::vector<std::string> extra{"--lse-out",  f.lse, "--k-scales", ks,
                                     "--v-scales", vs,    "--backend",  "cpu"};
      if (kv == DType::fp8_e4m3) extra.insert(extra.end(), {"--kv-dtype", "fp8_e4m3"});
      const CliResult r = run_cli(f.args(extra));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const AttentionOutput want = run_paged(c, Backend::cpu);
      EXPECT_TRUE(same_bits(cli::read_npy(f.out), want.out));
      EXPECT_TRUE(same_bits(cli::read_npy(f.lse), *want.lse));
    }
  // Float pools quantized on load: the cache write() makes from the same pools.
  PagedCaseSpec s;
  s.q_lens = {1, 3}, s.kv_lens = {40, 17}, s.page_size = 4;
  const PagedCase c = make_paged_case(s);
  const Files f(c);
  for (const char* kind : {"per_token", "per_tensor"}) {
    const CliResult r = run_cli(f.args({"--kv-dtype", "int8", "--kv-scales", kind, "--backend", "cpu"}));
    ASSERT_EQ(r.exit_code, 0) << r.err << " signal " << r.signal << " timed out " << r.timed_out;
    const PagedKVSpec& fs = c.cache.spec();
    const bool token = std::string(kind) == "per_token";
    std::optional<KVTensorScales> ts;
    if (!token) {  // each pool's absolute maximum over 127
      float mk = 0, mv = 0;
      for (std::int64_t i = 0; i < c.cache.k_pages().numel(); ++i)
        mk = std::max(mk, std::fabs(c.cache.k_pages().data_as<float>()[i]));
      for (std::int64_t i = 0; i < c.cache.v_pages().numel(); ++i)
        mv = std::max(mv, std::fabs(c.cache.v_pages().data_as<float>()[i]));
      ts = KVTensorScales{mk / 127.f, mv / 127.f};
    }
    PagedKVCache q8 = PagedKVCache::host({fs.num_pages, fs.page_size, fs.num_kv_heads, fs.head_dim, fs.dv(),
                                          DType::i8, token ? KVScales::per_token : KVScales::per_tensor},
                                         ts);
    const std::int64_t n = fs.num_pages * fs.page_size;
    Tensor slots(DType::i64, {n});
    for (std::int64_t i = 0; i < n; ++i) slots.data_as<std::int64_t>()[i] = i;
    q8.write(TensorView(c.cache.k_pages().data(), DType::f32, {n, fs.num_kv_heads, fs.head_dim}),
             TensorView(c.cache.v_pages().data(), DType::f32, {n, fs.num_kv_heads, fs.dv()}), slots);
    OperationMetadata md;
    md.backends = {Backend::cpu};
    const AttentionOutput want = registry().get("ragged_paged", md).paged(c.q, q8, c.batch, c.options);
    EXPECT_TRUE(same_bits(cli::read_npy(f.out), want.out)) << kind;
  }
  // Bad input: 8-bit pages without scales, a scale of 0, scales for float pages.
  PagedCaseSpec e;
  e.q_lens = {1}, e.kv_lens = {9}, e.kv_dtype = DType::i8;
  const PagedCase ce = make_paged_case(e);
  const Files fe(ce);
  const CliResult a = run_cli(fe.args());
  EXPECT_EQ(a.exit_code, 2);
  EXPECT_THAT(a.err, HasSubstr("k_scales"));
  Tensor zero = Tensor::copy_of(ce.cache.k_scales());
  zero.data_as<float>()[3] = 0.f;
  const std::string ks = fe.dir.file("ks.npy"), vs = fe.dir.file("vs.npy");
  cli::write_npy(ks, zero);
  cli::write_npy(vs, ce.cache.v_scales());
  const CliResult b = run_cli(fe.args({"--k-scales", ks, "--v-scales", vs}));
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_THAT(b.err, HasSubstr("k_scales: scale [0, 1, 1] is 0"));
  EXPECT_FALSE(exists(fe.out));
  const CliResult d = run_cli(f.args({"--k-scales", ks, "--v-scales", vs}));
  EXPECT_EQ(d.exit_code, 2);
  EXPECT_THAT(d.err, HasSubstr("--k-scales"));
}

// `attnops info` says what the serving path offers: the cache dtypes and scale kinds.
TEST(PagedCli, InfoListsTheServingPath) {
  const CliResult r = run_cli({"info", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  const auto& dtypes = doc["serving"]["cache_dtypes"];
  EXPECT_NE(std::find(dtypes.begin(), dtypes.end(), "int8"), dtypes.end()) << doc["serving"].dump();
  EXPECT_NE(std::find(dtypes.begin(), dtypes.end(), "fp8_e4m3"), dtypes.end());
  EXPECT_EQ(doc["serving"]["scales"].size(), 2u);
  const CliResult t = run_cli({"info"});
  EXPECT_THAT(t.out, HasSubstr("Serving (ragged_paged"));
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
      EXPECT_EQ(row["kernel"], "paged_decode") << row.dump();
      EXPECT_LT(row["max_err"].get<double>(), 2e-3) << row.dump();
    }
  }
  // An 8-bit decode batch and a shared-prefix batch with sharing on and off.
  cli::testing::write_file(
      dir.file("q.yaml"),
      "backends: [cpu]\ndtypes: [bf16]\nrepeats: 1\nread_bandwidth_mib: 16\nserving:\n"
      "  - {label: q8, seqs: 3, kv_len: [5, 90], q_len: 1, heads: [4, 2], head_dim: 16, page_size: 4,"
      " kv_dtype: [same, int8, fp8_e4m3]}\n"
      "  - {label: shared, seqs: 4, kv_len: [5, 40], shared_prefix: 64, q_len: 1, heads: [4, 2],"
      " head_dim: 16, page_size: 4, kv_split_tokens: 16, share: [on, off]}\n");
  const CliResult q = run_cli({"bench", "--file", dir.file("q.yaml"), "--serving-json", dir.file("q.json")});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  const auto qdoc = nlohmann::json::parse(cli::testing::read_file(dir.file("q.json")));
  ASSERT_EQ(qdoc["rows"].size(), 5u);
  for (const auto& row : qdoc["rows"]) {
    EXPECT_EQ(row["error"], "") << row.dump();
    EXPECT_LT(row["max_err"].get<double>(), 2e-2) << row.dump();
  }
  EXPECT_EQ(qdoc["rows"][1]["kv_dtype"], "int8");
  EXPECT_EQ(qdoc["rows"][2]["kv_dtype"], "fp8_e4m3");
  EXPECT_EQ(qdoc["rows"][3]["shared_keys"], 64);  // 4 splits of 16 shared by all 4 sequences
  EXPECT_EQ(qdoc["rows"][4]["shared_keys"], 0);
  // A wrong key names the file, the line and the key.
  cli::testing::write_file(dir.file("bad.yaml"), "serving:\n  - {seqs: 0}\n");
  const CliResult b = run_cli({"bench", "--file", dir.file("bad.yaml")});
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_THAT(b.err, HasSubstr("bad.yaml:2:"));
  EXPECT_THAT(b.err, HasSubstr("serving: seqs"));
}

}  // namespace
}  // namespace attnops::testing
