// A hung submission: with ATTNOPS_VK_INJECT_FAULT=hang (debug::Fault::hang)
// every submission ends waiting for an event that only the host sets, when the test lets it go
// (debug::release_injected_hangs): a queue that does not finish, on any device. The call must
// fail with gpu_error once the fence wait times out -- while the work is still pending, not after
// it was let go (the old path waited in vkDeviceWaitIdle, which has no timeout) -- leave
// the caller's buffers untouched, abandon the device, and the next call must run on a new one.
// The abandoned device is destroyed at release() once its work has finished (here: let go).
// A variant whose self-check hangs costs the check's short timeout once: it is disabled on the
// device for the process and in the self-check cache, and later calls go straight to the next
// variant or backend.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "attnops/ext/problem.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

#if ATTNOPS_TEST_VULKAN_BUILT
#include "backends/vulkan/vk_selfcheck.h"
#endif

namespace attnops::testing {
namespace {

using VulkanHang = VulkanTest;

// Lets the hung kernel go after `seconds` unless told to earlier.
class Watchdog {
 public:
  explicit Watchdog(int seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; });
          released_ = true;
          vulkan::debug::release_injected_hangs();
        }) {}
  ~Watchdog() { stop(); }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool released() const { return released_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> released_{false};
  std::thread thread_;
};

TEST_F(VulkanHang, TimeoutAbandonsTheDeviceWithoutWaitingForTheKernel) {
  Case c = make_case(Spec().shape(1, 16, 16).heads(2, 1).dim(8), 5);
  const AttentionProblem p = problem_for(c);
  {
    AttentionBuffers warm = allocate_buffers(p);  // pipelines compiled outside the short timeout
    vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), warm);
  }
  AttentionBuffers b = allocate_buffers(p);
  setenv("ATTNOPS_VK_TIMEOUT_MS", "300", 1);
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::hang);
  bool released_before_return = true;
  std::string error;
  {
    Watchdog dog(15);  // the old path returned only after this let the kernel go
    try {
      vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
    } catch (const Error& e) {
      error = std::string(error_code_name(e.code())) + ": " + e.what();
    }
    released_before_return = dog.released();
    dog.stop();
  }
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::none);
  setenv("ATTNOPS_VK_TIMEOUT_MS", "900000", 1);
  vulkan::debug::release_injected_hangs();
  EXPECT_FALSE(released_before_return) << "the call waited for the hung kernel to finish";
  EXPECT_NE(error.find("gpu_error"), std::string::npos) << error;
  EXPECT_NE(error.find("timed out"), std::string::npos) << error;
  for (std::int64_t i = 0; i < b.out.numel(); ++i) ASSERT_EQ(b.out.at(static_cast<std::size_t>(i)), 0.f);

  // The next call runs on a new device and is right.
  const vulkan::debug::ObjectCounts before = vulkan::debug::object_counts();
  vulkan::run(vulkan::Kernel::flash, p, nullptr, software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));
  EXPECT_EQ(vulkan::debug::object_counts().devices, before.devices + 1);
  vulkan::release();  // destroys the abandoned device too (its kernel was let go)
}

// Under the dispatcher the timeout is a gpu_error and the cpu answers.
TEST_F(VulkanHang, TheDispatcherFallsBackToTheCpu) {
  Case c = make_case(Spec().shape(1, 20, 20).heads(2, 1).dim(8), 6);
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  cfg.gpu_allow_software = true;
  Registry r;
  register_builtin_operators(r);
  const Attention attn = r.get("flash_attn2", cfg);
  attn(c.q, c.k, c.v, c.options);  // warm
  setenv("ATTNOPS_VK_TIMEOUT_MS", "300", 1);
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::hang);
  AttentionOutput out;
  EXPECT_NO_THROW(out = attn(c.q, c.k, c.v, c.options));
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::none);
  setenv("ATTNOPS_VK_TIMEOUT_MS", "900000", 1);
  vulkan::debug::release_injected_hangs();
  EXPECT_EQ(out.decision.backend, Backend::cpu) << out.decision.to_log_line();
  EXPECT_TRUE(out.decision.has(ReasonCode::gpu_error)) << out.decision.to_log_line();
  EXPECT_NE(out.decision.to_log_line().find("timed out"), std::string::npos) << out.decision.to_log_line();
  vulkan::release();
}

#if ATTNOPS_TEST_VULKAN_BUILT
namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The number after "within " in a hung check's reason (its timeout in ms), or -1.
long long timeout_in(const std::string& text) {
  const auto at = text.find("did not finish within ");
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + 22);
}

class VulkanHungVariant : public VulkanTest {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (IsSkipped()) return;
    vulkan::reset_selfchecks();
    unsetenv("ATTNOPS_VK_SELFTEST");
    ::unsetenv("ATTNOPS_VK_TIMEOUT_MS");  // the default: the checks' own short timeout must apply
    dir_ = fs::temp_directory_path() / ("attnops_hang_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    settings_ = software_ok();
    settings_.pipeline_cache = (dir_ / "pipelines.bin").string();
  }
  void TearDown() override {
    vulkan::debug::set_inject_fault(vulkan::debug::Fault::none);
    vulkan::debug::set_fault_variant("");
    vulkan::debug::release_injected_hangs();
    setenv("ATTNOPS_VK_TIMEOUT_MS", "900000", 1);
    vulkan::reset_selfchecks();
    vulkan::release();
    std::error_code ec;
    fs::remove_all(dir_, ec);
    VulkanTest::TearDown();
  }
  std::string cache_text() const { return slurp(settings_.pipeline_cache + ".selfcheck"); }
  // A prefill with GQA that lavapipe runs with flash_subgroup, else flash_rowwise.
  Case subgroup_case() { return make_case(Spec().shape(1, 24, 40).heads(4, 2).dim(16).causal(true), 19); }
  fs::path dir_;
  GpuSettings settings_;
};

// flash_subgroup hangs (default settings): its check times out after the check's timeout, not
// the calls' 120 s, the variant is off, flash_rowwise is checked and runs the call, right. The
// next call submits flash_rowwise's work only; so does a new process (the cache file says so).
TEST_F(VulkanHungVariant, AHungVariantIsSubmittedOnceAndLaterCallsGoStraightToTheNext) {
  Case c = subgroup_case();
  const AttentionProblem p = problem_for(c);
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::hang);
  vulkan::debug::set_fault_variant("flash_subgroup");

  auto before = vulkan::debug::object_counts();
  AttentionBuffers b = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, settings_, b);
  auto after = vulkan::debug::object_counts();
  EXPECT_TRUE(within_tolerance(p, b));
  EXPECT_EQ(b.run.kernel, "flash_rowwise") << b.run.kernel_detail;
  EXPECT_NE(b.run.kernel_detail.find("flash_subgroup: selftest_failed: hung: its check did not finish"),
            std::string::npos)
      << b.run.kernel_detail;
  const long long waited = timeout_in(b.run.kernel_detail);
  EXPECT_GT(waited, 0) << b.run.kernel_detail;
  EXPECT_LT(waited, 120000) << "the check waited as long as a call: " << b.run.kernel_detail;
  // Each check is two submissions (its pipelines compiled by empty dispatches, then the timed
  // run): flash_subgroup's (hung), flash_rowwise's, then the call.
  EXPECT_EQ(after.submissions - before.submissions, 5u);

  before = vulkan::debug::object_counts();
  AttentionBuffers again = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, settings_, again);
  after = vulkan::debug::object_counts();
  EXPECT_EQ(again.run.kernel, "flash_rowwise") << again.run.kernel_detail;
  EXPECT_EQ(after.submissions - before.submissions, 1u) << "the hung variant was tried again";
  EXPECT_TRUE(within_tolerance(p, again));

  const std::string text = cache_text();
  EXPECT_NE(text.find("\nhang\tflash_subgroup\thung: "), std::string::npos) << text;
  bool listed = false;
  for (const auto& e : vulkan::selfcheck_results(settings_))
    listed = listed || (e.hung && e.key == "flash_subgroup (every configuration)" && !e.passed);
  EXPECT_TRUE(listed);

  vulkan::reset_selfchecks();  // as a new process: read back, nothing of flash_subgroup submitted
  before = vulkan::debug::object_counts();
  AttentionBuffers later = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, settings_, later);
  after = vulkan::debug::object_counts();
  EXPECT_EQ(later.run.kernel, "flash_rowwise") << later.run.kernel_detail;
  EXPECT_EQ(after.submissions - before.submissions, 1u);
}

// Every variant hangs: under the dispatcher each is submitted once (its check), then the gpu is
// refused with selftest_failed and the cpu answers; the next call submits nothing.
TEST_F(VulkanHungVariant, WhenEveryVariantHangsTheCpuAnswersAndTheGpuIsNotTriedAgain) {
  Case c = subgroup_case();
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::hang);
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  cfg.gpu_allow_software = true;
  cfg.gpu_pipeline_cache = settings_.pipeline_cache;
  Registry r;
  register_builtin_operators(r);
  const Attention attn = r.get("flash_attn2", cfg);
  auto before = vulkan::debug::object_counts();
  const AttentionOutput out = attn(c.q, c.k, c.v, c.options);
  auto after = vulkan::debug::object_counts();
  EXPECT_EQ(out.decision.backend, Backend::cpu) << out.decision.to_log_line();
  EXPECT_TRUE(out.decision.has(ReasonCode::selftest_failed)) << out.decision.to_log_line();
  const std::string log = out.decision.to_log_line();
  EXPECT_NE(log.find("flash_subgroup: selftest_failed: hung"), std::string::npos) << log;
  EXPECT_NE(log.find("flash_rowwise: selftest_failed: hung"), std::string::npos) << log;
  EXPECT_EQ(after.submissions - before.submissions, 4u) << log;  // one check (two submissions) per variant

  before = vulkan::debug::object_counts();
  const AttentionOutput next = attn(c.q, c.k, c.v, c.options);
  after = vulkan::debug::object_counts();
  EXPECT_EQ(next.decision.backend, Backend::cpu);
  EXPECT_TRUE(next.decision.has(ReasonCode::selftest_failed)) << next.decision.to_log_line();
  EXPECT_EQ(after.submissions - before.submissions, 0u);
  EXPECT_EQ(after.devices - before.devices, 0u) << "a new device was made for nothing";
}

// A call that times out (here: a 300 ms call timeout and a hang injected after its variant passed
// its check) has its variant checked again by the next call, under the check's timeout.
TEST_F(VulkanHungVariant, ACallThatTimesOutHasItsVariantCheckedAgain) {
  Case c = subgroup_case();
  const AttentionProblem p = problem_for(c);
  AttentionBuffers warm = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, settings_, warm);  // flash_subgroup's check passes
  ASSERT_EQ(warm.run.kernel.rfind("flash_subgroup", 0), 0u) << warm.run.kernel_detail;
  setenv("ATTNOPS_VK_TIMEOUT_MS", "300", 1);
  vulkan::debug::set_inject_fault(vulkan::debug::Fault::hang);
  vulkan::debug::set_fault_variant("flash_subgroup");
  AttentionBuffers b = allocate_buffers(p);
  EXPECT_THROW(vulkan::run(vulkan::Kernel::flash, p, nullptr, settings_, b), Error);
  EXPECT_EQ(cache_text().find("pass\tflash_subgroup"), std::string::npos) << "its pass is still trusted";
  ::unsetenv("ATTNOPS_VK_TIMEOUT_MS");
  const auto before = vulkan::debug::object_counts();
  AttentionBuffers next = allocate_buffers(p);
  vulkan::run(vulkan::Kernel::flash, p, nullptr, settings_, next);
  const auto after = vulkan::debug::object_counts();
  EXPECT_EQ(next.run.kernel, "flash_rowwise") << next.run.kernel_detail;
  EXPECT_NE(next.run.kernel_detail.find("flash_subgroup: selftest_failed: hung"), std::string::npos)
      << next.run.kernel_detail;
  EXPECT_EQ(after.submissions - before.submissions, 5u);  // the two checks (two each) and the call
  EXPECT_TRUE(within_tolerance(p, next));
}
#endif

}  // namespace
}  // namespace attnops::testing
