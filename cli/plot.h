// Plots of benchmark results with gnuplot: GFLOP/s per shape, one line per series.
#pragma once

#include <string>
#include <vector>

namespace attnops::cli {

struct PlotSeries {
  std::string name;            // legend, e.g. "blocksparse/cpu causal"
  std::vector<double> values;  // one per category; NaN where the series has no point
};

struct PlotSpec {
  std::string title;
  std::string ylabel;
  std::vector<std::string> categories;  // x axis labels, in order
  std::vector<PlotSeries> series;
  std::vector<std::pair<std::string, double>> hlines;  // reference lines (e.g. SGEMM)
};

// The gnuplot terminal line for `path`: .png -> pngcairo, .svg -> svg. Error(invalid_argument)
// for another extension.
std::string plot_terminal(const std::string& path);

// The gnuplot script (data inline) that draws `spec` into `path`; the terminal follows the
// extension (.png -> pngcairo, .svg -> svg). Error(invalid_argument) for another extension.
std::string gnuplot_script(const PlotSpec& spec, const std::string& path);

// Runs gnuplot on the script. Error(io_error) when gnuplot is missing or fails.
void write_plot(const PlotSpec& spec, const std::string& path);

}  // namespace attnops::cli
