// The subcommands of the `attnops` program. Each add_*_command declares its options on a CLI11
// subcommand and returns the action main() runs after a successful parse, so that parse errors
// (CLI11's) and run errors (attnops::Error, std::exception) are reported separately.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace attnops::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> action;  // returns the exit status
};

Command add_run_command(CLI::App& root);
Command add_info_command(CLI::App& root);
Command add_demo_command(CLI::App& root);
Command add_bench_command(CLI::App& root);
Command add_verify_command(CLI::App& root);

}  // namespace attnops::cli
