// Bounded reads and safe targets for the cache files beside the pipeline cache (cache_file.h).
#include "core/cache_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "core/printable.h"

namespace attnops {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

CacheFileRead read_cache_file(const std::string& path, std::size_t max_bytes) {
  CacheFileRead r;
  // O_NONBLOCK: opening a FIFO without a writer must not wait; it is refused below anyway.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    r.status = err == ENOENT ? CacheFileRead::Status::missing : CacheFileRead::Status::unreadable;
    r.why = std::strerror(err);
    return r;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    r.status = CacheFileRead::Status::not_regular;
    r.why = std::string("it is ") + kind_of(st.st_mode);
    ::close(fd);
    return r;
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    r.status = CacheFileRead::Status::too_large;
    r.why = std::to_string(st.st_size) + " bytes, over the limit of " + std::to_string(max_bytes);
    ::close(fd);
    return r;
  }
  // Read at most max_bytes + 1 bytes: a file that grows while it is read is refused too.
  r.bytes.resize(static_cast<std::size_t>(st.st_size) + 1);
  std::size_t got = 0;
  while (got < r.bytes.size()) {
    const ssize_t n = ::read(fd, r.bytes.data() + got, r.bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.status = CacheFileRead::Status::unreadable;
      r.why = std::strerror(errno);
      r.bytes.clear();
      ::close(fd);
      return r;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
    if (got > max_bytes) break;
  }
  ::close(fd);
  if (got > max_bytes || got > static_cast<std::size_t>(st.st_size)) {
    r.status = CacheFileRead::Status::too_large;
    r.why = "it grew past " + std::to_string(max_bytes) + " bytes while being read";
    r.bytes.clear();
    return r;
  }
  r.bytes.resize(got);
  r.status = CacheFileRead::Status::ok;
  return r;
}

bool cache_file_writable(const std::string& path, std::string* why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return true;  // absent (or unreachable: the write will say)
  if (S_ISREG(st.st_mode)) return true;
  if (why != nullptr) *why = std::string("it is ") + kind_of(st.st_mode);
  return false;
}

void warn_cache_file_once(const std::string& what, const std::string& path, const std::string& why,
                          const std::string& consequence) {
  static std::mutex* mu = new std::mutex;  // never destroyed (no teardown from exit())
  static auto* seen = new std::set<std::pair<std::string, std::string>>;
  std::lock_guard<std::mutex> lock(*mu);
  if (!seen->insert({what, path}).second) return;
  std::fprintf(stderr, "attnops: warning: %s %s: %s; %s\n", what.c_str(), printable(path).c_str(),
               why.c_str(), consequence.c_str());
}

}  // namespace attnops
