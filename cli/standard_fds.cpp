#include "cli/standard_fds.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace attnops::cli {

bool ensure_standard_descriptors() noexcept {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open() returns the lowest free descriptor, which is `fd` (those below it are open now).
    const int got = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (got != fd) {
      if (got >= 0) ::close(got);
      return false;
    }
  }
  return true;
}

}  // namespace attnops::cli
