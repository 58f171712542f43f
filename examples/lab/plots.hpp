// SPDX-License-Identifier: MIT
// The lab's line plots: seed bands, labelled length ticks, the legend beside the data, titles
// the font can draw (examples/support/png.hpp draws them).
#pragma once

#include "seeds.hpp"

#include <support/png.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace lab {

namespace png = posenc_examples;

/// `text` unchanged; throws std::invalid_argument naming the first character without a glyph.
inline std::string const& drawable(std::string const& text) {
  for (char ch : text)
    if (!png::has_glyph(ch))
      throw std::invalid_argument("lab: the plot text \"" + text + "\" has a character the font cannot draw (code " +
                                  std::to_string(static_cast<int>(static_cast<unsigned char>(ch))) + ")");
  return text;
}

/// The i-th of twelve distinct colors.
inline png::rgb plot_color(std::size_t i) {
  static std::uint32_t const p[] = {0x1F77B4, 0xFF7F0E, 0x2CA02C, 0xD62728, 0x9467BD, 0x8C564B,
                                    0xE377C2, 0x7F7F7F, 0xBCBD22, 0x17BECF, 0x000000, 0xAEC7E8};
  return png::hex(p[i % 12]);
}

/// The powers of two from lo to hi (both included when they are powers of two): length ticks.
inline std::vector<double> powers_of_two(double lo, double hi) {
  std::vector<double> t;
  for (double v = 1; v <= hi; v *= 2)
    if (v >= lo) t.push_back(v);
  return t;
}

/// A curve through the seeds' means with their min .. max as its band (lo, hi empty: no band).
struct seed_curve {
  std::string label;
  std::vector<double> x, y, lo, hi;
};

/// The seed curve of the spreads y at x.
inline seed_curve seed_curve_of(std::string const& label, std::vector<double> const& x, std::vector<spread> const& y) {
  seed_curve c{label, x, {}, {}, {}};
  for (auto const& s : y) {
    c.y.push_back(s.mean);
    c.lo.push_back(s.min);
    c.hi.push_back(s.max);
  }
  return c;
}

/// The mean of v over positions i - half .. i + half (fewer at the ends) for every i.
inline std::vector<double> smoothed(std::vector<double> const& v, int half) {
  std::vector<double> out(v.size());
  auto const n = static_cast<long>(v.size());
  for (long i = 0; i < n; ++i) {
    long a = std::max(0L, i - half), b = std::min(n - 1, i + half);
    double sum = 0;
    for (long j = a; j <= b; ++j) sum += v[static_cast<std::size_t>(j)];
    out[static_cast<std::size_t>(i)] = sum / static_cast<double>(b - a + 1);
  }
  return out;
}

/// What a lab plot shows besides its curves.
struct plot_text {
  std::string title, axes;
  bool log_x = false;
  std::vector<double> x_ticks, x_marks;  ///< labelled ticks (empty: automatic); dashed marks
};

/// A 480 x 260 plot of the curves (the i-th in plot_color(i)) over their bands, with the legend
/// right of the data; throws std::invalid_argument when a title, axis text or label has a
/// character the font cannot draw.
inline png::image line_plot(std::vector<seed_curve> const& lines, plot_text const& t) {
  png::plot_style s;
  s.title = drawable(t.title);
  s.axes = drawable(t.axes);
  std::vector<png::curve> curves;
  std::vector<png::band> bands;
  for (auto const& c : lines) {
    curves.push_back({drawable(c.label), c.x, c.y, plot_color(curves.size())});
    if (!c.lo.empty()) bands.push_back({c.x, c.lo, c.hi, curves.back().color});
  }
  s.width = 480;
  s.height = 260;
  s.log_x = t.log_x;
  s.x_ticks = t.x_ticks;
  s.x_marks = t.x_marks;
  s.legend_width = png::legend_width_for(curves);
  // the title may be wider than the plot and its legend: widen the plot area to fit it
  s.width = std::max(s.width, png::text_width(s.title) + 8 - png::plot_layout::left - png::plot_layout::right - s.legend_width);
  return png::render_curves(curves, s, bands);
}

}  // namespace lab
