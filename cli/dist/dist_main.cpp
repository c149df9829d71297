#include <cstring>
#include <iostream>
#include <string>
#include <string_view>

#include "attnops/error.h"
#include "cli/dist/dist_commands.h"

namespace attnops::cli {

bool is_distributed_command(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string_view cmd = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (cmd == "bench" && a == "--distributed") return true;
    if (cmd == "run") {
      std::string_view op;
      if (a == "--op" && i + 1 < argc) op = argv[i + 1];
      if (a.substr(0, 5) == "--op=") op = a.substr(5);
      if (op == "ring" || op == "ulysses") return true;
    }
  }
  return false;
}

int distributed_main(int argc, char** argv) {
  std::unique_ptr<World> world;
  try {
    world = open_world(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  const bool root = world->comm().rank() == 0;
  CLI::App app{"attnops: distributed attention (under mpirun)", "attnops"};
  app.require_subcommand(1);
  // As the single-process run: every error message on stderr starts with "error:".
  app.failure_message([](const CLI::App* sub, const CLI::Error& e) {
    return "error: " + std::string(e.what()) + "\n" + (sub ? "Run with --help for more information.\n" : "");
  });
  std::vector<DistCommand> commands;
  try {
    commands = {add_dist_run_command(app), add_dist_bench_command(app)};
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parsed the same line; only rank 0 speaks.
    if (root) {
      const int code = app.exit(e);
      return code == 0 ? 0 : 2;
    }
    return e.get_exit_code() == 0 ? 0 : 2;
  } catch (const CLI::Error& e) {
    std::cerr << "error: internal: " << e.what() << "\n";
    return 2;
  }
  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return c.action(*world);
    return 2;
  } catch (const dist::AgreedError& e) {
    // Every rank has this error and no message is in flight: rank 0 reports, all finish.
    if (root) std::cerr << "error: " << e.what() << " [" << error_code_name(e.code()) << "]\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "error: rank " << world->comm().rank() << ": " << e.what() << " ["
              << error_code_name(e.code()) << "]\n";
  } catch (const std::exception& e) {
    std::cerr << "error: rank " << world->comm().rank() << ": " << e.what() << "\n";
  }
  // Other ranks may be waiting for this one: end the job.
  std::cerr.flush();
  world->abort(2);
  return 2;  // not reached
}

}  // namespace attnops::cli
