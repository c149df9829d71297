#include "benchkit/plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "attnops/error.h"

namespace attnops::benchkit {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(ErrorCode::io_error, "--plot " + path + ": " + why);
}

// Closes a descriptor at scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string gnuplot_quoted(const std::string& s) {
  std::string out = "'";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\'')
      out += "''";
    else if (c < 0x20 || c == 0x7f)
      out += ' ';
    else
      out += ch;
  }
  return out + "'";
}

std::string plot_terminal(const std::string& path) {
  if (ends_with(path, ".png")) return "set terminal pngcairo size 1100,800 noenhanced font 'Sans,10'";
  if (ends_with(path, ".svg")) return "set terminal svg size 1100,800 noenhanced dynamic";
  throw Error(ErrorCode::invalid_argument, "--plot " + path + ": expected a .png or .svg file name");
}

std::string gnuplot_script(const PlotSpec& spec, const std::string& path) {
  std::ostringstream g;
  g << plot_terminal(path) << "\n";
  g << "set output\n";  // stdout: the path never enters the script
  g << "set title " << gnuplot_quoted(spec.title) << "\n";
  g << "set ylabel " << gnuplot_quoted(spec.ylabel) << "\n";
  g << "set grid ytics\nset key below\nset yrange [0:*]\n";
  g << "set xtics rotate by -30\nset datafile missing \"?\"\n";
  g << "set xrange [-0.5:" << (static_cast<double>(spec.categories.size()) - 0.5) << "]\n";
  g << "set xtics (";
  for (std::size_t i = 0; i < spec.categories.size(); ++i)
    g << (i ? ", " : "") << gnuplot_quoted(spec.categories[i]) << " " << i;
  g << ")\n";
  // Data blocks inline ($name << EOD), so there are no temporary data files to clean up.
  for (std::size_t s = 0; s < spec.series.size(); ++s) {
    g << "$s" << s << " << EOD\n";
    for (std::size_t i = 0; i < spec.categories.size(); ++i) {
      const double v = i < spec.series[s].values.size() ? spec.series[s].values[i] : NAN;
      g << i << " ";
      if (std::isfinite(v))
        g << v << "\n";
      else
        g << "?\n";
    }
    g << "EOD\n";
  }
  g << "plot ";
  bool first = true;
  for (std::size_t s = 0; s < spec.series.size(); ++s) {
    g << (first ? "" : ", \\\n     ") << "$s" << s << " using 1:2 with linespoints lw 2 pt 7 title "
      << gnuplot_quoted(spec.series[s].name);
    first = false;
  }
  for (const auto& [name, y] : spec.hlines) {
    g << (first ? "" : ", \\\n     ") << y << " with lines dt 2 lw 2 lc rgb \"black\" title "
      << gnuplot_quoted(name);
    first = false;
  }
  if (first) g << "NaN notitle";
  g << "\n";
  return g.str();
}

void write_plot(const PlotSpec& spec, const std::string& path, int fd) {
  const std::string script = gnuplot_script(spec, path);
  // gnuplot reads the script from a pipe on its stdin and writes the plot to its stdout, which
  // is `fd`; its own messages go to our stderr. No shell is involved (posix_spawnp).
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) fail(path, std::string("pipe: ") + std::strerror(errno));
  FdCloser read_end{pipe_fds[0]}, write_end{pipe_fds[1]};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, read_end.fd, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
  char arg0[] = "gnuplot";
  char* argv[] = {arg0, nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, "gnuplot", &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    fail(path, std::string("cannot start gnuplot (is gnuplot installed? ") + std::strerror(rc) + ")");
  ::close(read_end.fd);
  read_end.fd = -1;
  const char* data = script.data();
  std::size_t left = script.size();
  bool write_failed = false;
  while (left > 0) {  // a gnuplot that died early gives EPIPE (the program ignores SIGPIPE)
    const ssize_t w = ::write(write_end.fd, data, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      write_failed = true;
      break;
    }
    data += w;
    left -= static_cast<std::size_t>(w);
  }
  ::close(write_end.fd);
  write_end.fd = -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || write_failed)
    fail(path,
         "gnuplot failed (exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) fail(path, "gnuplot wrote nothing");
}

}  // namespace attnops::benchkit
