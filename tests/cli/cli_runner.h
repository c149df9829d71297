// Runs the real `attnops` binary for the CLI tests: stdout and stderr captured in files, an
// environment edited per call, and the way the child ended; optionally with another working
// directory, closed standard descriptors, a file-size or address-space limit, or in the background
// (to signal it).
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace attnops::cli::testing {

struct CliResult {
  int exit_code = -1;      // when the child exited normally
  int signal = 0;          // when a signal killed it (must never happen)
  bool timed_out = false;  // killed (SIGKILL) after CliOptions::timeout_seconds
  std::string out, err;
  std::string last_err_line() const;  // the last non-empty line on stderr
};

// env: variables to set (value) or unset (nullopt) in the child, on top of ours. The child's
// ATTNOPS_LOG, ATTNOPS_FORCE_NATIVE and ATTNOPS_VK_* are unset unless `env` sets them, so that
// the caller's shell cannot change what a test sees.
CliResult run_cli(const std::vector<std::string>& args,
                  const std::map<std::string, std::optional<std::string>>& env = {});

// A fresh temporary directory, removed with its contents at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// What run_cli_with / CliProcess change in the child besides its environment. The child always
// starts with SIGINT, SIGTERM, SIGPIPE and SIGXFSZ at their default actions and no signal
// blocked, whatever the test runner's own dispositions are.
struct CliOptions {
  std::map<std::string, std::optional<std::string>> env;                 // as run_cli's `env`
  std::string cwd;                                                       // empty: the test's own
  bool close_stdin = false, close_stdout = false, close_stderr = false;  // instead of redirecting
  long long file_size_limit = -1;      // RLIMIT_FSIZE in bytes (ulimit -f); -1: unchanged
  long long address_space_limit = -1;  // RLIMIT_AS in bytes (ulimit -v): allocations past it fail
  double timeout_seconds = 0;      // > 0: SIGKILL after this long (a test of a hang must end)
};

CliResult run_cli_with(const std::vector<std::string>& args, const CliOptions& options);

// The program started in the background (to signal it): wait() reaps it and returns what it
// wrote. The destructor kills (SIGKILL) and reaps a child that was not waited for.
class CliProcess {
 public:
  explicit CliProcess(const std::vector<std::string>& args, const CliOptions& options = {});
  ~CliProcess();
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;
  pid_t pid() const { return pid_; }
  CliResult wait();

 private:
  TempDir dir_;  // the captured stdout and stderr
  pid_t pid_ = -1;
  double timeout_seconds_ = 0;
};

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);

}  // namespace attnops::cli::testing
