// Plots of benchmark results with gnuplot: GFLOP/s per shape, one line per series.
//
// No text of the user's reaches gnuplot's parser as code: gnuplot expands `command` anywhere
// on a line and runs a line that starts with `!` in a shell. The output path is never in the
// script (gnuplot writes to its stdout, which is the caller's file descriptor), and every label
// is a single-quoted gnuplot string (no substitution inside) without control characters.
#pragma once

#include <string>
#include <vector>

namespace attnops::benchkit {

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

// `s` as a gnuplot single-quoted string: '' for a quote, control characters as spaces.
std::string gnuplot_quoted(const std::string& s);

// The gnuplot script (data inline) that draws `spec` to gnuplot's stdout; the terminal follows
// the extension of `path` (.png -> pngcairo, .svg -> svg), which is all the script takes from it.
// Error(invalid_argument) for another extension.
std::string gnuplot_script(const PlotSpec& spec, const std::string& path);

// Runs gnuplot on the script with its stdout on `fd` (the caller's output file for `path`,
// which only names it in messages). Error(io_error) when gnuplot is missing, fails or writes
// nothing.
void write_plot(const PlotSpec& spec, const std::string& path, int fd);

}  // namespace attnops::benchkit
