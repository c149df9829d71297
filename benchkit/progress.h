// A one-line progress bar on stderr ("[#####.....] 12/54 label"), redrawn in place with '\r'.
// Only drawn when enabled (the caller decides: stderr is a TTY, or --progress), so logs and
// pipes never fill with control characters.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace attnops::benchkit {

class ProgressBar {
 public:
  ProgressBar(std::size_t total, bool enabled, std::FILE* out = stderr);
  ~ProgressBar();  // finishes the line if the caller did not
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Shows `done` of `total` finished, and what is running now.
  void update(std::size_t done, const std::string& label);
  // Draws the full bar and ends the line.
  void finish();

  // Whether a bar should be drawn by default: stderr is a terminal.
  static bool stderr_is_tty();
  // The text of the bar for `done` of `total` (no '\r'); exposed for tests.
  static std::string render(std::size_t done, std::size_t total, const std::string& label,
                            std::size_t width = 30);

 private:
  std::size_t total_;
  bool enabled_;
  bool open_ = false;  // a line has been drawn and not yet ended
  std::FILE* out_;
  std::size_t last_len_ = 0;
};

}  // namespace attnops::benchkit
