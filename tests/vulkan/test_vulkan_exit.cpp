// Processes that used the GPU exit 0: a program that returns from main with and without
// release_gpu() (gpu_exit_probe), run as a subprocess. `attnops run --backend gpu`: test_cli_run.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

struct Exit {
  int status = -1, signal = 0;
  std::string out;
};

Exit run_process(const std::string& command) {
  Exit e;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return e;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) e.out.append(buf, n);
  const int w = pclose(p);
  if (WIFEXITED(w)) e.status = WEXITSTATUS(w);
  if (WIFSIGNALED(w)) e.signal = WTERMSIG(w);
  return e;
}

using VulkanExit = VulkanTest;

TEST_F(VulkanExit, ProgramsThatUsedTheGpuExitZero) {
  for (const char* mode : {"release", "leave"}) {
    const Exit e = run_process(std::string("ATTNOPS_VK_VALIDATION=1 ATTNOPS_VK_ALLOW_SOFTWARE=1 ") +
                               ATTNOPS_GPU_EXIT_PROBE + " " + mode);
    EXPECT_EQ(e.signal, 0) << mode << ": " << e.out;
    EXPECT_EQ(e.status, 0) << mode << ": " << e.out;
    EXPECT_NE(e.out.find("ran on gpu"), std::string::npos) << mode << ": " << e.out;
  }
}

}  // namespace
}  // namespace attnops::testing
