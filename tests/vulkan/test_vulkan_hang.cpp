// A hung submission (issue 19, item 4): with ATTNOPS_VK_INJECT_FAULT=hang (debug::Fault::hang)
// every submission ends waiting for an event that only the host sets, when the test lets it go
// (debug::release_injected_hangs): a queue that does not finish, on any device. The call must
// fail with gpu_error once the fence wait times out -- while the work is still pending, not after
// it was let go (the old path waited in vkDeviceWaitIdle, which has no timeout) -- leave
// the caller's buffers untouched, abandon the device, and the next call must run on a new one.
// The abandoned device is destroyed at release() once its work has finished (here: let go).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

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

}  // namespace
}  // namespace attnops::testing
