// The serving rows' read-bandwidth yardstick (benchkit/read_bandwidth.h): what it counts and how it
// sizes its buffer. No timing is asserted: the rate is the machine's.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "benchkit/read_bandwidth.h"
#include "tests/cli/cli_runner.h"

namespace attnops::cli {

using namespace benchkit;  // the benchmark harness's specs, timers and yardsticks
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// The bytes a pass is credited with are n * 4: every element must be read exactly once, by
// whichever thread owns it, the tails of the 64-float blocks and of the shares included.
TEST(ReadBandwidth, APassReadsEveryElementExactlyOnce) {
  for (const std::int64_t n : {0, 1, 63, 64, 65, 1000, 4097, 100003})
    for (const int threads : {1, 2, 3, 7}) {
      std::vector<float> x(static_cast<std::size_t>(n));
      double want = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        x[static_cast<std::size_t>(i)] = static_cast<float>(i % 7 + 1);  // exact in float and double sums
        want += static_cast<double>(i % 7 + 1);
      }
      EXPECT_EQ(read_pass(x.data(), n, threads), want) << "n " << n << ", " << threads << " threads";
    }
}

TEST(ReadBandwidth, TheBufferIsSeveralTimesTheLastLevelCacheAndFitsTheMemory) {
  // At least 256 MiB, and 4 x the LLC where that is more.
  EXPECT_EQ(read_buffer_bytes(32 * kMiB, 20480 * kMiB, 0), 256 * kMiB);
  EXPECT_EQ(read_buffer_bytes(0, 0, 0), 256 * kMiB);                       // nothing known
  EXPECT_EQ(read_buffer_bytes(260 * kMiB, 20480 * kMiB, 0), 1040 * kMiB);  // 8 x 32.5 MiB of L3
  EXPECT_EQ(read_buffer_bytes(100 * kMiB + 3, 0, 0), 400 * kMiB);          // whole MiB
  // Never more than half of the available memory.
  EXPECT_EQ(read_buffer_bytes(260 * kMiB, 1000 * kMiB, 0), 500 * kMiB);
  EXPECT_EQ(read_buffer_bytes(32 * kMiB, kMiB, 0), kMiB);  // and at least 1 MiB
  // An explicit size (the bench file's read_bandwidth_mib) wins, within the same bound.
  EXPECT_EQ(read_buffer_bytes(32 * kMiB, 20480 * kMiB, 16), 16 * kMiB);
  EXPECT_EQ(read_buffer_bytes(32 * kMiB, 100 * kMiB, 4096), 50 * kMiB);
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text << "\n";
}

// A fake /sys/devices/system/cpu: 4 CPUs, private L1 / L2, two L3 instances of 32 MiB (one per
// core complex of two CPUs), an offline CPU without a cache directory, and other entries.
TEST(ReadBandwidth, TheLastLevelCacheIsSummedOverItsInstances) {
  testing::TempDir dir;
  const std::string root = dir.path();
  for (int cpu = 0; cpu < 4; ++cpu) {
    const std::string c = root + "/cpu" + std::to_string(cpu) + "/cache";
    const std::string l3_shared = cpu < 2 ? "0-1" : "2-3";
    const char* rows[][4] = {{"1", "Data", "32K", ""},
                             {"1", "Instruction", "32K", ""},
                             {"2", "Unified", "512K", ""},
                             {"3", "Unified", "32768K", ""}};
    for (int i = 0; i < 4; ++i) {
      const std::string idx = c + "/index" + std::to_string(i);
      std::filesystem::create_directories(idx);
      write(idx + "/level", rows[i][0]);
      write(idx + "/type", rows[i][1]);
      write(idx + "/size", rows[i][2]);
      write(idx + "/shared_cpu_list", i == 3 ? l3_shared : std::to_string(cpu));
    }
  }
  std::filesystem::create_directories(root + "/cpu4");  // offline: no cache directory
  std::filesystem::create_directories(root + "/cpufreq");
  write(root + "/online", "0-3");
  EXPECT_EQ(last_level_cache_bytes(root), 64 * kMiB);
  EXPECT_EQ(last_level_cache_bytes(root + "/nowhere"), 0u);
}

}  // namespace
}  // namespace attnops::cli
