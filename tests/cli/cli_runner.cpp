#include "tests/cli/cli_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace attnops::cli::testing {

std::string CliResult::last_err_line() const {
  std::istringstream in(err);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/attnops_cli_XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

namespace {

std::vector<std::string> child_environment(const std::map<std::string, std::optional<std::string>>& env) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const char* name :
       {"ATTNOPS_LOG", "ATTNOPS_FORCE_NATIVE", "ATTNOPS_VK_ALLOW_SOFTWARE", "ATTNOPS_VK_DEVICE",
        "ATTNOPS_VK_VALIDATION", "ATTNOPS_VK_INJECT_FAULT", "ATTNOPS_VK_FORCE_STAGING", "ATTNOPS_PROFILE"})
    vars.erase(name);
  for (const auto& [k, v] : env) {
    if (v)
      vars[k] = *v;
    else
      vars.erase(k);
  }
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
  return env_strings;
}

// fork + exec: between them the child calls only async-signal-safe functions (the test process
// may have OpenMP threads). An exec failure exits 127.
pid_t start_child(const std::vector<std::string>& args, const CliOptions& o, const std::string& out_path,
                  const std::string& err_path) {
  std::vector<std::string> env_strings = child_environment(o.env);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  // ATTNOPS_TEST_CLI runs the tests against another build of the program (e.g. main's, to see a
  // new test fail before its fix); by default, this build's.
  const char* other = std::getenv("ATTNOPS_TEST_CLI");
  std::vector<std::string> argv_strings{other != nullptr && *other != '\0' ? other : ATTNOPS_CLI_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid > 0) return pid;
  const auto redirect = [](int target, const char* path, int flags, bool close_it) {
    if (close_it) {
      ::close(target);
      return;
    }
    const int fd = ::open(path, flags, 0644);
    if (fd < 0) ::_exit(127);
    if (fd != target) {
      ::dup2(fd, target);
      ::close(fd);
    }
  };
  redirect(STDIN_FILENO, "/dev/null", O_RDONLY, o.close_stdin);
  redirect(STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, o.close_stdout);
  redirect(STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, o.close_stderr);
  if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) ::_exit(127);
  if (o.file_size_limit >= 0) {
    const rlimit lim{static_cast<rlim_t>(o.file_size_limit), static_cast<rlim_t>(o.file_size_limit)};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(127);
  }
  if (o.address_space_limit >= 0) {
    const rlimit lim{static_cast<rlim_t>(o.address_space_limit), static_cast<rlim_t>(o.address_space_limit)};
    if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(127);
  }
  for (const int sig : {SIGINT, SIGTERM, SIGPIPE, SIGXFSZ}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(argv[0], argv.data(), envp.data());
  ::_exit(127);
}

CliResult reap(pid_t pid, const std::string& out_path, const std::string& err_path, double timeout_seconds) {
  int status = 0;
  bool timed_out = false;
  if (timeout_seconds > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
    for (;;) {
      const pid_t got = ::waitpid(pid, &status, WNOHANG);
      if (got == pid || (got < 0 && errno != EINTR)) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        timed_out = true;
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } else {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  CliResult r;
  r.timed_out = timed_out;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

}  // namespace

CliResult run_cli_with(const std::vector<std::string>& args, const CliOptions& options) {
  CliProcess p(args, options);
  return p.wait();
}

CliResult run_cli(const std::vector<std::string>& args,
                  const std::map<std::string, std::optional<std::string>>& env) {
  CliOptions o;
  o.env = env;
  return run_cli_with(args, o);
}

CliProcess::CliProcess(const std::vector<std::string>& args, const CliOptions& options)
    : pid_(start_child(args, options, dir_.file("stdout"), dir_.file("stderr"))),
      timeout_seconds_(options.timeout_seconds) {}

CliProcess::~CliProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

CliResult CliProcess::wait() {
  if (pid_ <= 0) throw std::logic_error("CliProcess::wait: already waited");
  const pid_t pid = pid_;
  pid_ = -1;
  return reap(pid, dir_.file("stdout"), dir_.file("stderr"), timeout_seconds_);
}

}  // namespace attnops::cli::testing
