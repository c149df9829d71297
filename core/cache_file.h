// Files the library keeps beside the Vulkan pipeline cache (the cache itself, `<cache>.rates`,
// `<cache>.selfcheck`): each is read with a bound and only when it is a regular file, so that a
// path pointing at /dev/zero, a FIFO, a directory or a runaway file costs nothing but a
// warning, and rewritten only when the target is absent or a regular file (never a device node
// or a FIFO: a write there would block or destroy something). A bad file is treated as absent:
// the caller rebuilds what it held. Internal to the library.
#pragma once

#include <cstddef>
#include <string>

namespace attnops {

struct CacheFileRead {
  enum class Status {
    ok,           // `bytes` holds the whole file
    missing,      // no such file (the normal first run): no warning
    not_regular,  // a directory, device, FIFO or socket
    too_large,    // more than the bound (or grew past it while read)
    unreadable,   // open or read failed (permissions, I/O error)
  };
  Status status = Status::missing;
  std::string bytes;
  std::string why;  // for a warning, e.g. "/dev/zero is not a regular file (a character device)"
};

// Reads `path` whole if it is a regular file of at most `max_bytes` bytes. Never blocks on a
// FIFO and never reads more than max_bytes + 1 bytes.
CacheFileRead read_cache_file(const std::string& path, std::size_t max_bytes);

// Whether `path` may be written as a regular file: true when it does not exist or is a regular
// file (a symbolic link is followed); false with *why otherwise.
bool cache_file_writable(const std::string& path, std::string* why);

// Prints "attnops: warning: <what> <path>: <why>; <consequence>" to stderr once per (what, path)
// in this process.
void warn_cache_file_once(const std::string& what, const std::string& path, const std::string& why,
                          const std::string& consequence);

}  // namespace attnops
