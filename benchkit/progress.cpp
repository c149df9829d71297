#include "benchkit/progress.h"

#include <unistd.h>

#include <algorithm>

namespace attnops::benchkit {

ProgressBar::ProgressBar(std::size_t total, bool enabled, std::FILE* out)
    : total_(total), enabled_(enabled), out_(out) {}

ProgressBar::~ProgressBar() {
  if (open_) finish();
}

bool ProgressBar::stderr_is_tty() {
  return ::isatty(STDERR_FILENO) == 1;
}

std::string ProgressBar::render(std::size_t done, std::size_t total, const std::string& label,
                                std::size_t width) {
  done = std::min(done, total);
  const std::size_t filled = total ? done * width / total : width;
  std::string s = "[";
  s.append(filled, '#');
  s.append(width - filled, '.');
  s += "] ";
  s += std::to_string(done);
  s += '/';
  s += std::to_string(total);
  if (!label.empty()) {
    s += ' ';
    s += label;
  }
  return s;
}

void ProgressBar::update(std::size_t done, const std::string& label) {
  if (!enabled_) return;
  const std::string s = render(done, total_, label);
  // Pad with blanks to erase the rest of a longer previous line.
  const std::size_t pad = last_len_ > s.size() ? last_len_ - s.size() : 0;
  std::fprintf(out_, "\r%s%s", s.c_str(), std::string(pad, ' ').c_str());
  std::fflush(out_);
  last_len_ = s.size();
  open_ = true;
}

void ProgressBar::finish() {
  if (!enabled_) return;
  update(total_, "done");
  std::fputc('\n', out_);
  std::fflush(out_);
  open_ = false;
}

}  // namespace attnops::benchkit
