// The temporary files of the outputs being written (cli/output_set.h), in a fixed table that a
// signal handler can read: SIGINT, SIGTERM or SIGHUP removes them before the program dies, so
// an interrupted run leaves no hidden `.attnops-*` file behind. Only async-signal-safe work
// happens in the handler: unlink() over the table, then the signal again with its default
// action (the shell sees the usual 128 + signal status).
//
// A slot is armed with its path before the file is created (open with O_EXCL), so a signal at
// any instant after the creation removes it. The one file the handler could remove without
// having created it is one of the same random name (64 bits) made by someone else, in the
// instant between our failed O_EXCL and the next name: not a case that occurs.
#pragma once

#include <string>

namespace attnops::cli {

// Installs the cleanup handler for SIGINT, SIGTERM and SIGHUP (a signal ignored at start, as
// under nohup or for a background job, stays ignored) and ignores SIGXFSZ, so that writing past
// a file-size limit (ulimit -f) fails with EFBIG, an io_error, instead of killing the process
// with a partial file. Called once by main() before any work.
void install_signal_handlers();

// A slot for one temporary file; released (and the file left alone) by the destructor.
class TempFileSlot {
 public:
  TempFileSlot();  // Error(io_error) when every slot is taken
  ~TempFileSlot();
  TempFileSlot(const TempFileSlot&) = delete;
  TempFileSlot& operator=(const TempFileSlot&) = delete;
  TempFileSlot(TempFileSlot&& other) noexcept;
  TempFileSlot& operator=(TempFileSlot&&) = delete;

  // Before creating `path`: from now on a signal removes it. Error(io_error) if it is too long.
  void arm(const std::string& path);
  void disarm();  // not created, renamed or removed: never touch it again

 private:
  int index_ = -1;
};

}  // namespace attnops::cli
