// core/cache_file.h: the bounded reads and safe targets of the files beside the Vulkan pipeline
// cache. /dev/zero, a FIFO (no writer: the read must not block), a directory and a file over the
// bound are refused without reading them; a regular file within the bound is read whole.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/cache_file.h"

namespace attnops {
namespace {

using Status = CacheFileRead::Status;

struct Dir {
  std::filesystem::path path;
  Dir() {
    char tmpl[] = "/tmp/attnops_cache_file_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& bytes) const {
    const std::string p = (path / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
};

TEST(CacheFile, ReadsARegularFileWithinTheBound) {
  Dir d;
  const std::string p = d.file("a", std::string(100, 'x'));
  const CacheFileRead r = read_cache_file(p, 100);
  EXPECT_EQ(r.status, Status::ok);
  EXPECT_EQ(r.bytes, std::string(100, 'x'));
  EXPECT_EQ(read_cache_file(d.file("empty", ""), 10).status, Status::ok);
}

TEST(CacheFile, RefusesWhatIsNotARegularFileOrTooLarge) {
  Dir d;
  EXPECT_EQ(read_cache_file((d.path / "missing").string(), 100).status, Status::missing);
  EXPECT_EQ(read_cache_file(d.file("big", std::string(101, 'x')), 100).status, Status::too_large);
  const CacheFileRead zero = read_cache_file("/dev/zero", 100);
  EXPECT_EQ(zero.status, Status::not_regular);
  EXPECT_EQ(zero.why, "it is a character device");
  EXPECT_EQ(read_cache_file(d.path.string(), 100).status, Status::not_regular);
  const std::string fifo = (d.path / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(read_cache_file(fifo, 100).status, Status::not_regular);  // returns: no writer needed
  std::filesystem::create_symlink("/dev/zero", d.path / "link");
  EXPECT_EQ(read_cache_file((d.path / "link").string(), 100).status, Status::not_regular);
}

TEST(CacheFile, WritableOnlyWhenAbsentOrRegular) {
  Dir d;
  std::string why;
  EXPECT_TRUE(cache_file_writable((d.path / "new").string(), &why));
  EXPECT_TRUE(cache_file_writable(d.file("old", "x"), &why));
  EXPECT_FALSE(cache_file_writable("/dev/null", &why));
  EXPECT_EQ(why, "it is a character device");
  EXPECT_FALSE(cache_file_writable(d.path.string(), &why));
  std::filesystem::create_symlink("/dev/zero", d.path / "link");
  EXPECT_FALSE(cache_file_writable((d.path / "link").string(), &why));
}

}  // namespace
}  // namespace attnops
