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

// Where the symbolic links starting at `path` end (a file that need not exist), as open()
// follows them: a relative link resolves against the directory of the link. ELOOP after 40.
std::string follow_links(const std::string& path, const std::string& what) {
  std::string p = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::string target(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 255) + 1, '\0');
    const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
    if (n < 0 || static_cast<std::size_t>(n) >= target.size())
      fail(what, path, "cannot read the symbolic link " + p);
    target.resize(static_cast<std::size_t>(n));
    const std::size_t slash = p.rfind('/');
    p = target.front() == '/' || slash == std::string::npos ? target : p.substr(0, slash + 1) + target;
  }
  fail(what, path, "too many levels of symbolic links");
}

// /dev/null (the character device 1:3, under any name): an output that is computed and discarded.
bool is_dev_null(const struct stat& st) {
  struct stat null_st {};
  return S_ISCHR(st.st_mode) && ::stat("/dev/null", &null_st) == 0 && S_ISCHR(null_st.st_mode) &&
         st.st_rdev == null_st.st_rdev;
}

}  // namespace

OutputSet::~OutputSet() {
  for (Output& o : outputs_) {
    if (o.fd >= 0) ::close(o.fd);
    if (!committed_ && !o.temp.empty()) ::unlink(o.temp.c_str());
  }
}

// The file `path` (links followed already) names, as an identity that does not depend on the
// spelling: the directory's (device, inode) and the last component, plus the file's own
// (device, inode) when it exists (hard links). Fails as add() would for a missing directory;
// messages name `shown`, the path as the user gave it.
OutputSet::Target OutputSet::locate(const std::string& path, const std::string& shown,
                                    const std::string& what) {
  Target t;
  const std::size_t slash = path.rfind('/');
  t.dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  t.name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  if (t.name.empty() || t.name == "." || t.name == "..") fail(what, shown, "is a directory");
  struct stat st {};
  if (::stat(t.dir.c_str(), &st) != 0) fail(what, shown, "cannot create it (" + errno_text() + ")");
  if (!S_ISDIR(st.st_mode)) fail(what, shown, "cannot create it (" + t.dir + " is not a directory)");
  t.dir_dev = st.st_dev;
  t.dir_ino = st.st_ino;
  if (::stat(path.c_str(), &st) == 0) {
    t.exists = true;
    t.dev = st.st_dev;
    t.ino = st.st_ino;
    t.mode = st.st_mode;
    t.dev_null = is_dev_null(st);
  }
  return t;
}

bool OutputSet::Target::same_file(const Target& o) const {
  if (dev_null && o.dev_null) return false;  // several outputs may be discarded
  return (dir_dev == o.dir_dev && dir_ino == o.dir_ino && name == o.name) ||
         (exists && o.exists && dev == o.dev && ino == o.ino);
}

int OutputSet::add(const std::string& path, const std::string& what) {
  if (path.empty()) fail(what, path, "empty path");
  const std::string resolved = follow_links(path, what);
  const Target target = locate(resolved, path, what);
  for (const Output& o : outputs_)
    if (o.target.same_file(target))
      fail(what, path, "is also the output of " + o.what + "; give each output its own file");
  Output o;
  o.path = path;
  o.resolved = resolved;
  o.what = what;
  o.target = target;
  if (target.exists && S_ISDIR(target.mode)) fail(what, path, "is a directory");
  if (target.exists && !S_ISREG(target.mode)) {
    // A FIFO would block (or feed a reader a partial file), a device cannot be replaced: only
    // /dev/null, which discards the output, is written in place.
    if (!target.dev_null)
      fail(what, path,
           "is not a regular file (a FIFO, socket or device); give a file name (/dev/null discards an "
           "output)");
    o.fd = ::open(resolved.c_str(), O_WRONLY | O_CLOEXEC);
    if (o.fd < 0) fail(what, path, "cannot open for writing (" + errno_text() + ")");
    outputs_.push_back(std::move(o));
    return static_cast<int>(outputs_.size()) - 1;
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
  // The file replacing an existing one keeps its permission bits (not its owner: the new file
  // is the caller's).
  if (target.exists && ::fchmod(o.fd, target.mode & 0777) != 0)
    fail(what, path, "cannot set the mode of its temporary (" + errno_text() + ")");
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
    if (::rename(o.temp.c_str(), o.resolved.c_str()) != 0)
      fail(o.what, o.path, "cannot replace it (" + errno_text() + ")");
    o.slot->disarm();  // renamed: the name is the target's now
    o.temp.clear();
  }
  committed_ = true;
}

}  // namespace attnops::cli
