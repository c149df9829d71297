// Runs the real `attnops` binary for the CLI tests: posix_spawn with stdout and stderr captured
// in files, an environment edited per call, and the way the child ended.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace attnops::cli::testing {

struct CliResult {
  int exit_code = -1;  // when the child exited normally
  int signal = 0;      // when a signal killed it (must never happen)
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

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);

}  // namespace attnops::cli::testing
