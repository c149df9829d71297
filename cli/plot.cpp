#include "cli/plot.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "attnops/error.h"

namespace attnops::cli {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string plot_terminal(const std::string& path) {
  if (ends_with(path, ".png")) return "set terminal pngcairo size 1100,800 noenhanced font 'Sans,10'";
  if (ends_with(path, ".svg")) return "set terminal svg size 1100,800 noenhanced dynamic";
  throw Error(ErrorCode::invalid_argument, "--plot " + path + ": expected a .png or .svg file name");
}

std::string gnuplot_script(const PlotSpec& spec, const std::string& path) {
  std::ostringstream g;
  g << plot_terminal(path) << "\n";
  g << "set output " << quoted(path) << "\n";
  g << "set title " << quoted(spec.title) << "\n";
  g << "set ylabel " << quoted(spec.ylabel) << "\n";
  g << "set grid ytics\nset key below\nset yrange [0:*]\n";
  g << "set xtics rotate by -30\nset datafile missing \"?\"\n";
  g << "set xrange [-0.5:" << (static_cast<double>(spec.categories.size()) - 0.5) << "]\n";
  g << "set xtics (";
  for (std::size_t i = 0; i < spec.categories.size(); ++i)
    g << (i ? ", " : "") << quoted(spec.categories[i]) << " " << i;
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
      << quoted(spec.series[s].name);
    first = false;
  }
  for (const auto& [name, y] : spec.hlines) {
    g << (first ? "" : ", \\\n     ") << y << " with lines dt 2 lw 2 lc rgb \"black\" title " << quoted(name);
    first = false;
  }
  if (first) g << "NaN notitle";
  g << "\n";
  return g.str();
}

void write_plot(const PlotSpec& spec, const std::string& path) {
  const std::string script = gnuplot_script(spec, path);
  // gnuplot reads the script from stdin; its own messages go to our stderr.
  std::FILE* p = ::popen("gnuplot", "w");
  if (!p) throw Error(ErrorCode::io_error, "--plot: cannot start gnuplot");
  std::fwrite(script.data(), 1, script.size(), p);
  const int status = ::pclose(p);
  if (status != 0)
    throw Error(ErrorCode::io_error, "--plot " + path +
                                         ": gnuplot failed (is gnuplot installed? exit status " +
                                         std::to_string(status) + ")");
  std::ifstream check(path);
  if (!check) throw Error(ErrorCode::io_error, "--plot " + path + ": gnuplot wrote no file");
}

}  // namespace attnops::cli
