// `attnops`: run an attention operator on .npy files, show what this host can run, demo and
// benchmark the operators. Exit status: 0 success; 2 usage error or bad input, with a message
// on stderr that starts with "error:". The program never dies by a signal it can avoid.
#include <CLI/CLI.hpp>
#include <csignal>
#include <exception>
#include <iostream>
#include <new>
#include <vector>

#include "attnops/error.h"
#include "attnops/gpu.h"
#include "cli/commands.h"
#include "cli/dist/dist_commands.h"
#include "cli/standard_fds.h"
#include "cli/temp_files.h"

namespace {

constexpr int kExitError = 2;

std::string failure_message(const CLI::App* app, const CLI::Error& e) {
  std::string msg = "error: " + std::string(e.what()) + "\n";
  if (app) msg += "Run with --help for more information.\n";
  return msg;
}

}  // namespace

namespace {
int run_main(int argc, char** argv);
}  // namespace

// The GPU state is released before main returns, on every path: nothing Vulkan may run from exit().
int main(int argc, char** argv) {
  // First of all: a closed 0, 1 or 2 gets /dev/null, so no file we open becomes stderr.
  if (!attnops::cli::ensure_standard_descriptors()) return kExitError;
  // SIGINT / SIGTERM / SIGHUP remove the outputs' temporaries; SIGXFSZ is ignored (a write past
  // ulimit -f fails with an io_error).
  attnops::cli::install_signal_handlers();
  const int status = run_main(argc, argv);
  try {
    attnops::release_gpu();
  } catch (const std::exception& e) {
    std::cerr << "error: releasing the GPU: " << e.what() << "\n";
    return status == 0 ? kExitError : status;
  }
  return status;
}

namespace {

int run_main(int argc, char** argv) {
  // A closed pipe on stdout (attnops bench | head) must end the program with an error status,
  // not kill it with SIGPIPE; writes then fail and the streams report it.
  std::signal(SIGPIPE, SIG_IGN);
  // run --op ring|ulysses and bench --distributed: on every rank of an mpirun job (cli/dist/).
  if (attnops::cli::is_distributed_command(argc, argv)) return attnops::cli::distributed_main(argc, argv);

  CLI::App app{"attnops: attention operators with backend dispatch", "attnops"};
  app.require_subcommand(1);
  app.failure_message(failure_message);
  app.set_version_flag("--version", "attnops " ATTNOPS_VERSION);
  app.footer(
      "Exit status: 0 success; 2 usage error or bad input (message on stderr starting with 'error:');\n"
      "verify: 1 when the fuzzer found a mismatch.\n"
      "Environment: ATTNOPS_LOG=dispatch prints one line per dispatch decision on stderr;\n"
      "ATTNOPS_FORCE_NATIVE=1 (true, yes) runs every call on the native backend.");
  std::vector<attnops::cli::Command> commands;
  try {
    commands = {attnops::cli::add_run_command(app), attnops::cli::add_info_command(app),
                attnops::cli::add_demo_command(app), attnops::cli::add_bench_command(app),
                attnops::cli::add_verify_command(app)};
  } catch (const CLI::Error& e) {  // a bug in our option declarations
    std::cerr << "error: internal: " << e.what() << "\n";
    return kExitError;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help / version / the message
    return code == 0 ? 0 : kExitError;
  }

  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return c.action();
    return kExitError;  // unreachable: require_subcommand(1)
  } catch (const attnops::Error& e) {
    std::cerr << "error: " << e.what() << " [" << attnops::error_code_name(e.code()) << "]\n";
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return kExitError;
}

}  // namespace
