// `attnops bench --plot FILE`: no text of the user's reaches gnuplot's parser as code. gnuplot
// expands `command` (back-quotes) anywhere on a line, runs a line starting with `!` in a shell,
// and a newline inside a string ends the command: unquoted, a plot named
// x`touch PWNED`.svg would run `touch PWNED`. Each name below must give a plot at exactly that name
// and run nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "attnops/error.h"
#include "benchkit/plot.h"
#include "tests/cli/cli_runner.h"

namespace attnops::cli {

using namespace benchkit;  // the benchmark harness's specs, timers and yardsticks
namespace {

using testing::CliOptions;
using testing::CliResult;
using ::testing::HasSubstr;
using testing::TempDir;

bool have_gnuplot() {
  return std::system("command -v gnuplot >/dev/null 2>&1") == 0;
}

// Every file under `dir` whose name starts with "PWNED" (a command that ran would have made one).
std::vector<std::string> markers(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("PWNED", 0) == 0) found.push_back(n);
  }
  return found;
}

std::vector<std::string> bench_args(const std::string& plot) {
  return {"bench",     "--ops", "vanilla", "--backends", "native",        "--shapes", "1,1,8,8",
          "--repeats", "1",     "--sgemm", "0",          "--no-progress", "--plot",   plot};
}

TEST(PlotFileNames, HostileNamesRunNothingAndNameThePlot) {
  if (!have_gnuplot()) GTEST_SKIP() << "gnuplot is not installed";
  const std::vector<std::string> names = {
      "a`touch PWNED_backquote`.svg",
      "b\n!touch PWNED_bang\n.svg",
      "c\"`touch PWNED_dquote`\".svg",
      "d'`touch PWNED_squote`'.svg",
      "e$(touch PWNED_dollar)${HOME}.svg",
      "f\\\"\n!touch PWNED_escaped_quote\n.svg",
      "g@PWNED_macro;!touch PWNED_semicolon.svg",
      "h\"; system(\"touch PWNED_system\"); \".svg",
  };
  for (const std::string& name : names) {
    TempDir dir;  // also the child's working directory, where a relative `touch` would land
    CliOptions o;
    o.cwd = dir.path();
    const std::string path = dir.file(name);
    const CliResult r = testing::run_cli_with(bench_args(path), o);
    EXPECT_EQ(r.signal, 0);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_THAT(markers(dir.path()), ::testing::IsEmpty()) << "a command ran for the name " << name;
    EXPECT_THAT(testing::read_file(path), HasSubstr("<svg")) << name;
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      files.push_back(e.path().filename().string());
    EXPECT_THAT(files, ::testing::ElementsAre(name)) << "the plot only, no temporary left";
  }
}

// A hostile directory part: the path is never given to gnuplot either.
TEST(PlotFileNames, HostileDirectoryRunsNothing) {
  if (!have_gnuplot()) GTEST_SKIP() << "gnuplot is not installed";
  TempDir dir;
  const std::string sub = dir.file("d`touch PWNED_dir`\n!touch PWNED_dir_bang");
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  CliOptions o;
  o.cwd = dir.path();
  const CliResult r = testing::run_cli_with(bench_args(sub + "/p.svg"), o);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(markers(dir.path()), ::testing::IsEmpty());
  EXPECT_THAT(testing::read_file(sub + "/p.svg"), HasSubstr("<svg"));
}

// Labels (title, axis, categories, series) are single-quoted gnuplot strings: no back-quote,
// macro or escape processing inside, '' for a quote, control characters (a newline would end
// the command) replaced by spaces.
TEST(PlotFileNames, LabelsAreInertStrings) {
  PlotSpec spec;
  spec.title = "t`touch PWNED`\n!touch PWNED2";
  spec.ylabel = "it's @x";
  spec.categories = {"c\"\\`x`"};
  spec.series = {{"s\r\n'quoted'", {1}}};
  spec.hlines = {{"h`y`", 2}};
  const std::string script = gnuplot_script(spec, "x.svg");
  EXPECT_THAT(script, HasSubstr("set title 't`touch PWNED` !touch PWNED2'\n"));
  EXPECT_THAT(script, HasSubstr("set ylabel 'it''s @x'\n"));
  EXPECT_THAT(script, HasSubstr("('c\"\\`x`' 0)"));
  EXPECT_THAT(script, HasSubstr("title 's  ''quoted'''"));
  EXPECT_THAT(script, HasSubstr("title 'h`y`'"));
  EXPECT_THAT(script, ::testing::Not(HasSubstr("\"t`"))) << "no double-quoted user text";
  if (!have_gnuplot()) return;
  TempDir dir;
  spec.title = "`touch " + dir.file("PWNED") + "`";
  const std::string out = dir.file("p.svg");
  FILE* f = std::fopen(out.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  write_plot(spec, out, ::fileno(f));
  std::fclose(f);
  EXPECT_THAT(markers(dir.path()), ::testing::IsEmpty());
  EXPECT_THAT(testing::read_file(out), HasSubstr("<svg"));
}

}  // namespace
}  // namespace attnops::cli
