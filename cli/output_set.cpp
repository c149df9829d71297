#include "cli/output_set.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "attnops/error.h"

namespace attnops::cli {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, const std::string& why) {
  throw Error(ErrorCode::io_error, what + " '" + path + "': " + why);
}

std::string errno_text() {
  return std::strerror(errno);
}

// A name in the target's directory that no one else uses: ".attnops-XXXXXXXXXXXXXXXX" (64
// random bits). Fixed length, whatever the target's name: a target of NAME_MAX bytes works.
std::string temp_name(const std::string& dir, std::mt19937_64& rng) {
  char name[32];
  std::snprintf(name, sizeof name, ".attnops-%016llx", static_cast<unsigned long long>(rng()));
  return dir + "/" + name;
}

}  // namespace

OutputSet::~OutputSet() {
  for (Output& o : outputs_) {
    if (o.fd >= 0) ::close(o.fd);
    if (!committed_ && !o.temp.empty()) ::unlink(o.temp.c_str());
  }
}

// The file a path names, as an identity that does not depend on the spelling: the directory's
// (device, inode) and the last component, plus the file's own (device, inode) when it exists
// (hard links, symlinks). Fails as add() would for a missing directory.
OutputSet::Target OutputSet::locate(const std::string& path, const std::string& what) {
  if (path.empty()) fail(what, path, "empty path");
  Target t;
  const std::size_t slash = path.rfind('/');
  t.dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  t.name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  if (t.name.empty() || t.name == "." || t.name == "..") fail(what, path, "is a directory");
  struct stat st {};
  if (::stat(t.dir.c_str(), &st) != 0) fail(what, path, "cannot create it (" + errno_text() + ")");
  if (!S_ISDIR(st.st_mode)) fail(what, path, "cannot create it (" + t.dir + " is not a directory)");
  t.dir_dev = st.st_dev;
  t.dir_ino = st.st_ino;
  if (::stat(path.c_str(), &st) == 0) {
    t.exists = true;
    t.dev = st.st_dev;
    t.ino = st.st_ino;
    t.mode = st.st_mode;
  }
  return t;
}

bool OutputSet::Target::same_file(const Target& o) const {
  return (dir_dev == o.dir_dev && dir_ino == o.dir_ino && name == o.name) ||
         (exists && o.exists && dev == o.dev && ino == o.ino);
}

int OutputSet::add(const std::string& path, const std::string& what) {
  const Target target = locate(path, what);
  for (const Output& o : outputs_)
    if (o.target.same_file(target))
      fail(what, path, "is also the output of " + o.what + "; give each output its own file");
  Output o;
  o.path = path;
  o.what = what;
  o.target = target;
  if (target.exists) {
    const mode_t mode = target.mode;
    if (S_ISDIR(mode)) fail(what, path, "is a directory");
    if (!S_ISREG(mode)) {  // a FIFO or a device: written in place
      o.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      if (o.fd < 0) fail(what, path, "cannot open for writing (" + errno_text() + ")");
      outputs_.push_back(std::move(o));
      return static_cast<int>(outputs_.size()) - 1;
    }
  }
  // O_EXCL: never reuse a file someone else made; mode 0666 & ~umask, as a plain create would.
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  o.slot.emplace();
  for (int attempt = 0; attempt < 100 && o.fd < 0; ++attempt) {
    o.temp = temp_name(target.dir, rng);
    o.slot->arm(o.temp);  // a signal from now on removes it
    o.fd = ::open(o.temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (o.fd < 0) {
      const int err = errno;
      o.slot->disarm();  // not ours
      errno = err;
    }
    if (o.fd < 0 && errno != EEXIST) fail(what, path, "cannot create it (" + errno_text() + ")");
  }
  if (o.fd < 0) fail(what, path, "cannot create a temporary file next to it");
  outputs_.push_back(std::move(o));
  return static_cast<int>(outputs_.size()) - 1;
}

int OutputSet::fd(int index) const {
  return outputs_.at(static_cast<std::size_t>(index)).fd;
}

void OutputSet::write(int index, const std::string& bytes) const {
  const Output& o = outputs_.at(static_cast<std::size_t>(index));
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t w = ::write(o.fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(o.what, o.path, "write failed (" + errno_text() + ")");
    p += w;
    left -= static_cast<std::size_t>(w);
  }
}

const std::string& OutputSet::name(int index) const {
  return outputs_.at(static_cast<std::size_t>(index)).path;
}

void OutputSet::commit() {
  for (Output& o : outputs_) {
    const int fd = o.fd;
    o.fd = -1;
    if (::close(fd) != 0) fail(o.what, o.path, "write failed (" + errno_text() + ")");
  }
  for (Output& o : outputs_) {
    if (o.temp.empty()) continue;
    if (::rename(o.temp.c_str(), o.path.c_str()) != 0)
      fail(o.what, o.path, "cannot replace it (" + errno_text() + ")");
    o.slot->disarm();  // renamed: the name is the target's now
    o.temp.clear();
  }
  committed_ = true;
}

}  // namespace attnops::cli
