// The GPU's failure paths and cache files through the real program,
// on lavapipe (allowed through ATTNOPS_VK_ALLOW_SOFTWARE or the config; the tests skip without
// a Vulkan device):
//  - a Vulkan device whose creation fails (every allocation refused, ATTNOPS_VK_INJECT_FAULT=oom;
//    or gpu.pipeline_cache naming a directory, which throws from the cache read) must not
//    crash the process at exit: `run`, `demo` and `bench` exit 0 with their output, the gpu
//    failure recorded and the cpu's answer given;
//  - the pipeline cache and its `.rates` file are read with a bound: pointed at /dev/zero, a
//    FIFO or a file of gigabytes they are ignored with a warning, never fatal, and never written
//    through (a device node or FIFO is not replaced by a cache file). The child runs under a
//    2 GiB address-space limit, so that a regression ends in an allocation failure instead of
//    eating the machine's memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "cli/npy.h"
#include "tests/cli/cli_runner.h"
#include "tests/support/testing.h"

namespace attnops::cli {
namespace {

using attnops::testing::random_tensor;
using testing::CliResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::run_cli;
using testing::TempDir;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // shadow memory needs terabytes of address space
#else
constexpr bool kSanitized = false;
#endif

bool have_vulkan_device() {
  GpuSettings s;
  s.allow_software = true;
  return registry().host().availability(Backend::gpu, s).available;
}

// run_cli with the child's address space capped at 2 GiB (a gpu run on lavapipe needs < 1 GiB).
// posix_spawn's child inherits the limit, set here around the spawn and restored after.
CliResult run_cli_bounded(const std::vector<std::string>& args,
                          const std::map<std::string, std::optional<std::string>>& env = {}) {
  if (kSanitized) return run_cli(args, env);
  rlimit old{};
  ::getrlimit(RLIMIT_AS, &old);
  rlimit capped = old;
  capped.rlim_cur = std::min<rlim_t>(old.rlim_max, rlim_t{2} << 30);
  ::setrlimit(RLIMIT_AS, &capped);
  CliResult r;
  try {
    r = run_cli(args, env);
  } catch (...) {
    ::setrlimit(RLIMIT_AS, &old);
    throw;
  }
  ::setrlimit(RLIMIT_AS, &old);
  return r;
}

struct Inputs {
  TempDir dir;
  Tensor q = random_tensor(DType::f32, {1, 40, 4, 16}, 1), k = random_tensor(DType::f32, {1, 40, 2, 16}, 2),
         v = random_tensor(DType::f32, {1, 40, 2, 16}, 3);
  std::string out = dir.file("out.npy");
  Inputs() {
    write_npy(dir.file("q.npy"), q);
    write_npy(dir.file("k.npy"), k);
    write_npy(dir.file("v.npy"), v);
  }
  std::vector<std::string> run_args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> a{"run",
                               "--op",
                               "flash_attn2",
                               "--q",
                               dir.file("q.npy"),
                               "--k",
                               dir.file("k.npy"),
                               "--v",
                               dir.file("v.npy"),
                               "--out",
                               out};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string config(const std::string& pipeline_cache, const std::string& backend = "gpu") const {
    const std::string path = dir.file("gpu.yaml");
    testing::write_file(path, "backend: " + backend + "\ngpu: {allow_software: true, pipeline_cache: '" +
                                  pipeline_cache + "'}\n");
    return path;
  }
  // The output exists and is the right answer (whichever backend computed it).
  void expect_right_output() const {
    ASSERT_TRUE(std::filesystem::exists(out));
    const Tensor got = read_npy(out);
    AttentionOptions o;
    const AttentionProblem p = make_problem(q, k, v, o, OperationMetadata{});
    AttentionBuffers want = allocate_buffers(p);
    native::reference_attention(p, want);
    ASSERT_EQ(got.numel(), want.out.numel());
    float worst = 0;
    for (std::int64_t i = 0; i < got.numel(); ++i)
      worst = std::max(worst, std::abs(got.data_as<float>()[i] - want.out.data_as<float>()[i]));
    EXPECT_LT(worst, 1e-4f);
  }
};

void expect_clean_exit(const CliResult& r, const std::string& what) {
  EXPECT_EQ(r.signal, 0) << what << " died by a signal; stderr:\n" << r.err;
  EXPECT_EQ(r.exit_code, 0) << what << "; stderr:\n" << r.err;
}

// ---- item 2: a failed device creation, then a clean exit ----------------------------------------

TEST(CliGpuFailures, DeviceCreationOutOfMemoryExitsZeroWithTheCpuAnswer) {
  if (!have_vulkan_device()) GTEST_SKIP() << "no Vulkan device";
  const std::map<std::string, std::optional<std::string>> env{{"ATTNOPS_VK_INJECT_FAULT", "oom"},
                                                              {"ATTNOPS_VK_ALLOW_SOFTWARE", "1"}};
  Inputs in;
  const CliResult run = run_cli(in.run_args({"--backend", "gpu", "--explain"}), env);
  expect_clean_exit(run, "run");
  EXPECT_THAT(run.err, HasSubstr("gpu_error"));
  EXPECT_THAT(run.err, HasSubstr("out of device memory"));
  in.expect_right_output();

  const CliResult demo = run_cli({"demo", "--backend", "gpu"}, env);
  expect_clean_exit(demo, "demo");
  EXPECT_THAT(demo.out, HasSubstr("gpu_error"));

  const CliResult bench = run_cli({"bench", "--ops", "flash_attn2", "--backends", "gpu", "--shapes",
                                   "1,2,64,16", "--repeats", "1", "--sgemm", "0", "--no-progress"},
                                  env);
  expect_clean_exit(bench, "bench");
  EXPECT_THAT(bench.out, HasSubstr("gpu_error"));
}

TEST(CliGpuFailures, PipelineCacheThatIsADirectoryIsIgnoredWithAWarning) {
  if (!have_vulkan_device()) GTEST_SKIP() << "no Vulkan device";
  Inputs in;
  const std::string cache_dir = in.dir.file("cache.d");
  std::filesystem::create_directory(cache_dir);
  const std::string cfg = in.config(cache_dir);
  const CliResult run = run_cli(in.run_args({"--config", cfg, "--explain"}));
  expect_clean_exit(run, "run");
  EXPECT_THAT(run.err, HasSubstr("warning: Vulkan pipeline cache"));
  EXPECT_THAT(run.err, HasSubstr("it is a directory"));
  EXPECT_THAT(run.err, HasSubstr("\"backend\": \"gpu\""));  // the gpu ran, without a cache
  in.expect_right_output();
  EXPECT_TRUE(std::filesystem::is_directory(cache_dir));

  expect_clean_exit(run_cli({"demo", "--config", cfg}), "demo");
  expect_clean_exit(run_cli({"bench", "--ops", "flash_attn2", "--backends", "gpu", "--shapes", "1,2,64,16",
                             "--repeats", "1", "--sgemm", "0", "--no-progress", "--config", cfg}),
                    "bench");
}

// A hung kernel (ATTNOPS_VK_INJECT_FAULT=hang): the self-check's submission of each variant times
// out (after the check's own timeout, at most ATTNOPS_VK_TIMEOUT_MS), each variant is off, the gpu
// is refused with selftest_failed, the cpu answers, and the process exits 0 (the abandoned devices
// are let go and destroyed at release).
TEST(CliGpuFailures, AHungSubmissionTimesOutAndTheCpuAnswers) {
  if (!have_vulkan_device()) GTEST_SKIP() << "no Vulkan device";
  Inputs in;
  const CliResult r =
      run_cli(in.run_args({"--backend", "gpu", "--explain"}), {{"ATTNOPS_VK_INJECT_FAULT", "hang"},
                                                               {"ATTNOPS_VK_TIMEOUT_MS", "300"},
                                                               {"ATTNOPS_VK_ALLOW_SOFTWARE", "1"}});
  expect_clean_exit(r, "run");
  EXPECT_THAT(r.err, HasSubstr("selftest_failed"));
  EXPECT_THAT(r.err, HasSubstr("hung: its check did not finish within 300 ms (fence wait timed out"));
  EXPECT_THAT(r.err, HasSubstr("\"backend\": \"cpu\""));
  in.expect_right_output();
}

// The self-check: a run with gpu.pipeline_cache set keeps the results
// beside it, and a later `attnops info` (another process) shows them with the kernel variants
// this build holds and the device could run; a wrong answer injected into flash_subgroup's
// check shows up as FAIL and the run still answers right.
TEST(CliGpuSelfCheck, InfoShowsTheCachedResultsAndTheVariants) {
  if (!have_vulkan_device()) GTEST_SKIP() << "no Vulkan device";
  Inputs in;
  const std::string cache = in.dir.file("pipelines.bin");
  const std::string cfg = in.config(cache);
  const CliResult r = run_cli(in.run_args({"--config", cfg, "--explain"}),
                              {{"ATTNOPS_VK_INJECT_FAULT", "wrong_result:flash_subgroup"}});
  expect_clean_exit(r, "run");
  EXPECT_THAT(r.err, HasSubstr("flash_subgroup: selftest_failed")) << r.err;
  in.expect_right_output();
  ASSERT_TRUE(std::filesystem::exists(cache + ".selfcheck"));
  const CliResult info = run_cli({"info", "--config", cfg});
  expect_clean_exit(info, "info");
  EXPECT_THAT(info.out, HasSubstr("self-check FAIL flash_subgroup f32 D16 Dv16")) << info.out;
  EXPECT_THAT(info.out, HasSubstr("self-check pass flash_rowwise f32 D16 Dv16")) << info.out;
  EXPECT_THAT(info.out, HasSubstr("kernel flash_subgroup: built; this device: yes")) << info.out;
  EXPECT_THAT(info.out, HasSubstr("kernel flash_coopmat_khr: ")) << info.out;
  const CliResult json = run_cli({"info", "--json", "--config", cfg});
  expect_clean_exit(json, "info --json");
  EXPECT_THAT(json.out, HasSubstr("\"selfchecks\"")) << json.out;
  EXPECT_THAT(json.out, HasSubstr("\"kernel_variants\"")) << json.out;
}

// ---- item 3: cache files read with a bound -------------------------------------------------------

TEST(CliGpuCacheFiles, PipelineCacheOnDevZeroAFifoOrAHugeFileIsIgnored) {
  if (!have_vulkan_device()) GTEST_SKIP() << "no Vulkan device";
  Inputs in;
  const std::string zero = in.dir.file("zero.bin"), fifo = in.dir.file("fifo.bin"),
                    huge = in.dir.file("huge.bin");
  std::filesystem::create_symlink("/dev/zero", zero);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  {
    testing::write_file(huge, "");
    std::filesystem::resize_file(huge, std::uintmax_t{3} << 30);  // sparse: 3 GiB of zeros, no disk
  }
  for (const std::string& cache : {zero, fifo, huge}) {
    SCOPED_TRACE(cache);
    std::filesystem::remove(in.out);
    const CliResult r = run_cli_bounded(in.run_args({"--config", in.config(cache), "--explain"}));
    expect_clean_exit(r, "run");
    EXPECT_THAT(r.err, HasSubstr("warning: Vulkan pipeline cache " + cache));
    EXPECT_THAT(r.err, HasSubstr("\"backend\": \"gpu\""));
    in.expect_right_output();
  }
  // Nothing was written through the link or into the FIFO; the huge regular file was replaced by
  // a fresh cache.
  EXPECT_TRUE(std::filesystem::is_symlink(zero));
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/zero"));
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  EXPECT_LT(std::filesystem::file_size(huge), std::uintmax_t{64} << 20);
}

TEST(CliGpuCacheFiles, RatesFileOnDevZeroIsIgnoredAndTheRatesMeasured) {
  if (!have_vulkan_device()) GTEST_SKIP() << "no Vulkan device";
  Inputs in;
  const std::string cache = in.dir.file("pipelines.bin");
  std::filesystem::create_symlink("/dev/zero", cache + ".rates");
  // backend auto: the cost rule reads the rates beside the pipeline cache.
  const CliResult r = run_cli_bounded(in.run_args({"--config", in.config(cache, "auto"), "--explain"}));
  expect_clean_exit(r, "run");
  EXPECT_THAT(r.err, HasSubstr("warning: cost-rate cache " + cache + ".rates"));
  EXPECT_THAT(r.err, HasSubstr("\"rates\": \"measured\""));
  in.expect_right_output();
  EXPECT_TRUE(std::filesystem::is_symlink(cache + ".rates"));
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/zero"));
  EXPECT_TRUE(std::filesystem::is_regular_file(cache));  // the pipeline cache itself was written

  // A rates file of garbage is ignored the same way; a good one is used.
  std::filesystem::remove(cache + ".rates");
  testing::write_file(cache + ".rates", std::string(100, 'x'));
  const CliResult g = run_cli(in.run_args({"--config", in.config(cache, "auto"), "--explain"}));
  expect_clean_exit(g, "run");
  EXPECT_THAT(g.err, HasSubstr("warning: cost-rate cache"));
  testing::write_file(cache + ".rates",
                      "cpu_gflops=1 gpu_gflops=1000 upload_gbps=100 download_gbps=100 call_us=1\n");
  const CliResult ok = run_cli(in.run_args({"--config", in.config(cache, "auto"), "--explain"}));
  expect_clean_exit(ok, "run");
  EXPECT_THAT(ok.err, Not(HasSubstr("warning")));
  EXPECT_THAT(ok.err, HasSubstr("\"rates\": \"cache " + cache + ".rates\""));
}

}  // namespace
}  // namespace attnops::cli
