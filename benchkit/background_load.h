// `attnops bench --background-load N`: N busy child processes (`yes > /dev/null` each, or a
// spinning loop where `yes` cannot be run) for the loaded samples of each row, so the quiet and loaded
// medians of the same build come from one command (a library whose second thread waits for a
// descheduled worker is 100x slower on a busy machine; this is how to see it).
//
// The children are started once per row and stopped (SIGSTOP) between loaded samples, so quiet and
// loaded samples can alternate: on a shared VM whose speed drifts by tens of percent within minutes,
// a quiet block followed by a loaded block measured the drift as much as the load.
//
// The children are killed (SIGKILL) and reaped by the destructor, on success and on an error
// alike; if the bench process dies by a signal, the kernel kills them (PR_SET_PDEATHSIG), and
// they ignore nothing: SIGINT / SIGTERM / SIGHUP take their default action (not the parent's
// cleanup handler, which would unlink the parent's temporaries).
#pragma once

#include <sys/types.h>

#include <vector>

namespace attnops::benchkit {

class BackgroundLoad {
 public:
  explicit BackgroundLoad(int n);  // Error(io_error) if a process cannot be started
  ~BackgroundLoad();
  BackgroundLoad(const BackgroundLoad&) = delete;
  BackgroundLoad& operator=(const BackgroundLoad&) = delete;

  int size() const { return static_cast<int>(children_.size()); }

  // SIGSTOP / SIGCONT every child: a stopped child takes no CPU. resume() waits `settle_ms` so the
  // scheduler has them running before anything is timed.
  void pause() noexcept;
  void resume(int settle_ms) noexcept;

 private:
  void stop() noexcept;
  std::vector<pid_t> children_;
};

}  // namespace attnops::benchkit
