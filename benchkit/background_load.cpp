#include "benchkit/background_load.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "attnops/error.h"

namespace attnops::benchkit {
namespace {

// The child: only async-signal-safe calls after fork() (the parent may have threads). It becomes
// `yes > /dev/null` (the load the issue measured with; its own address space, so the bench's pages
// are not shared copy-on-write with a child for the whole row), or spins if yes cannot be run.
[[noreturn]] void busy_child(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);     // kept across exec
  if (::getppid() != parent) ::_exit(0);  // the parent died before prctl
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
  const int null = ::open("/dev/null", O_WRONLY);
  if (null >= 0) {
    ::dup2(null, STDOUT_FILENO);
    char yes[] = "yes";
    char* const argv[] = {yes, nullptr};
    char* const envp[] = {nullptr};
    ::execve("/usr/bin/yes", argv, envp);  // execve: async-signal-safe, no PATH search
    ::execve("/bin/yes", argv, envp);
  }
  volatile unsigned long spin = 0;
  for (;;) spin = spin + 1;
}

}  // namespace

BackgroundLoad::BackgroundLoad(int n) {
  children_.reserve(static_cast<std::size_t>(n > 0 ? n : 0));
  const pid_t parent = ::getpid();
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) busy_child(parent);
    if (pid < 0) {
      const int err = errno;
      stop();
      throw Error(ErrorCode::io_error, "--background-load: cannot start busy process " +
                                           std::to_string(i + 1) + ": " + std::strerror(err));
    }
    children_.push_back(pid);
  }
  // Let the scheduler see them running before anything is timed.
  if (n > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

void BackgroundLoad::pause() noexcept {
  for (const pid_t pid : children_) ::kill(pid, SIGSTOP);
}

void BackgroundLoad::resume(int settle_ms) noexcept {
  for (const pid_t pid : children_) ::kill(pid, SIGCONT);
  if (settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
}

BackgroundLoad::~BackgroundLoad() {
  stop();
}

void BackgroundLoad::stop() noexcept {
  for (const pid_t pid : children_) ::kill(pid, SIGKILL);  // SIGKILL ends a stopped child too
  for (const pid_t pid : children_) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  children_.clear();
}

}  // namespace attnops::benchkit
