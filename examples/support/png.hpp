// SPDX-License-Identifier: MIT
// PNG pictures for the examples: colormaps, heatmaps with axes and a colorbar, curves, a 5x7 font.
//
// Not part of the posenc headers: the examples and tools use it to draw
// encodings and attention maps. Writing goes through stb_image_write
// (Debian: libstb-dev); everything else here is plain C++17.
//
// Colormaps, both interpolated linearly in sRGB between published control points:
// - viridis (van der Walt, Smith and Firing, the matplotlib default; CC0): every
//   8th entry of its published 256-entry table plus the last one. Endpoints
//   #440154 (t = 0) and #FDE725 (t = 1). Used for non-negative maps.
// - RdBu reversed (ColorBrewer "RdBu", 11 classes, Brewer 2002): #053061 (-1,
//   dark blue) ... #F7F7F7 (0, near white) ... #67001F (+1, dark red). Used for
//   signed maps, symmetric around 0 so that white means zero.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace posenc_examples {

/// An 8-bit sRGB color.
struct rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(rgb a, rgb c) { return a.r == c.r && a.g == c.g && a.b == c.b; }
  friend bool operator!=(rgb a, rgb c) { return !(a == c); }
};

/// rgb from 0xRRGGBB.
constexpr rgb hex(std::uint32_t v) {
  return {static_cast<std::uint8_t>(v >> 16), static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v)};
}

/// The published endpoints and midpoint of the two colormaps.
inline constexpr std::uint32_t viridis_first = 0x440154, viridis_last = 0xFDE725;
inline constexpr std::uint32_t diverging_negative = 0x053061, diverging_zero = 0xF7F7F7,
                               diverging_positive = 0x67001F;

namespace detail {

inline std::uint8_t to_byte(double x) {
  return static_cast<std::uint8_t>(std::lround(std::clamp(x, 0.0, 1.0) * 255.0));
}
inline double clamp01(double t) { return std::isnan(t) ? 0.0 : std::clamp(t, 0.0, 1.0); }

}  // namespace detail

/// viridis at t in [0, 1] (clamped; NaN reads as 0).
inline rgb viridis(double t) {
  // {index into the 256-entry table, r, g, b}: entries 0, 8, ..., 248 and 255.
  static constexpr double table[33][4] = {
      {0, 0.267004, 0.004874, 0.329415},   {8, 0.277018, 0.050344, 0.375715},
      {16, 0.282327, 0.094955, 0.417331},  {24, 0.282884, 0.135920, 0.453427},
      {32, 0.278826, 0.175490, 0.483397},  {40, 0.270595, 0.214069, 0.507052},
      {48, 0.258965, 0.251537, 0.524736},  {56, 0.244972, 0.287675, 0.537260},
      {64, 0.229739, 0.322361, 0.545706},  {72, 0.214298, 0.355619, 0.551184},
      {80, 0.199430, 0.387607, 0.554642},  {88, 0.185556, 0.418570, 0.556753},
      {96, 0.172719, 0.448791, 0.557885},  {104, 0.160665, 0.478540, 0.558115},
      {112, 0.149039, 0.508051, 0.557250}, {120, 0.137770, 0.537492, 0.554906},
      {128, 0.127568, 0.566949, 0.550556}, {136, 0.120565, 0.596422, 0.543611},
      {144, 0.120638, 0.625828, 0.533488}, {152, 0.132268, 0.655014, 0.519661},
      {160, 0.157851, 0.683765, 0.501686}, {168, 0.196571, 0.711827, 0.479221},
      {176, 0.246070, 0.738910, 0.452024}, {184, 0.304148, 0.764704, 0.419943},
      {192, 0.369214, 0.788888, 0.382914}, {200, 0.440137, 0.811138, 0.340967},
      {208, 0.515992, 0.831158, 0.294279}, {216, 0.595839, 0.848717, 0.243329},
      {224, 0.678489, 0.863742, 0.189503}, {232, 0.762373, 0.876424, 0.137064},
      {240, 0.845561, 0.887322, 0.099702}, {248, 0.926106, 0.897330, 0.104071},
      {255, 0.993248, 0.906157, 0.143936}};
  double x = detail::clamp01(t) * 255.0;
  int k = std::min(static_cast<int>(x / 8.0), 31);
  double const* a = table[k];
  double const* b = table[k + 1];
  double f = (x - a[0]) / (b[0] - a[0]);
  return {detail::to_byte(a[1] + f * (b[1] - a[1])), detail::to_byte(a[2] + f * (b[2] - a[2])),
          detail::to_byte(a[3] + f * (b[3] - a[3]))};
}

/// Reversed ColorBrewer RdBu at t in [-1, 1] (clamped): blue < 0, white at 0, red > 0.
inline rgb diverging(double t) {
  static constexpr std::uint32_t table[11] = {0x053061, 0x2166AC, 0x4393C3, 0x92C5DE, 0xD1E5F0, 0xF7F7F7,
                                              0xFDDBC7, 0xF4A582, 0xD6604D, 0xB2182B, 0x67001F};
  double x = detail::clamp01((t + 1.0) / 2.0) * 10.0;
  int k = std::min(static_cast<int>(x), 9);
  double f = x - k;
  rgb a = hex(table[k]), b = hex(table[k + 1]);
  auto mix = [f](std::uint8_t u, std::uint8_t v) {
    return static_cast<std::uint8_t>(std::lround(u + f * (static_cast<double>(v) - u)));
  };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

/// An RGB image, row-major, 3 bytes per pixel.
class image {
 public:
  image() = default;
  image(int width, int height, rgb fill = hex(0xFFFFFF))
      : width_(width), height_(height), pixels_(static_cast<std::size_t>(width) * height * 3) {
    if (width <= 0 || height <= 0) throw std::invalid_argument("image: width and height must be > 0");
    fill_rect(0, 0, width, height, fill);
  }
  int width() const noexcept { return width_; }
  int height() const noexcept { return height_; }
  std::uint8_t const* data() const noexcept { return pixels_.data(); }

  /// Sets pixel (x, y); outside the image it does nothing (drawing clips).
  void set(int x, int y, rgb c) noexcept {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    std::uint8_t* p = &pixels_[(static_cast<std::size_t>(y) * width_ + x) * 3];
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
  }
  rgb get(int x, int y) const {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) throw std::out_of_range("image::get: outside the image");
    std::uint8_t const* p = &pixels_[(static_cast<std::size_t>(y) * width_ + x) * 3];
    return {p[0], p[1], p[2]};
  }
  void fill_rect(int x, int y, int w, int h, rgb c) noexcept {
    for (int j = y; j < y + h; ++j)
      for (int i = x; i < x + w; ++i) set(i, j, c);
  }
  /// Draws `other` with its top-left corner at (x, y).
  void blit(image const& other, int x, int y) noexcept {
    for (int j = 0; j < other.height_; ++j)
      for (int i = 0; i < other.width_; ++i) {
        std::uint8_t const* p = &other.pixels_[(static_cast<std::size_t>(j) * other.width_ + i) * 3];
        set(x + i, y + j, {p[0], p[1], p[2]});
      }
  }
  /// A straight line from (x0, y0) to (x1, y1) (Bresenham).
  void line(int x0, int y0, int x1, int y1, rgb c) noexcept {
    int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      set(x0, y0, c);
      if (x0 == x1 && y0 == y1) break;
      int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }

 private:
  int width_ = 0, height_ = 0;
  std::vector<std::uint8_t> pixels_;
};

// ---------------------------------------------------------------------------
// Text: a 5x7 bitmap font (digits, capital letters, signs), 6 px per character. A character
// without a glyph draws as a boxed '?' mark (has_glyph tells which ones have one).

/// Glyph size and the horizontal step from one character to the next, in pixels at scale 1.
inline constexpr int glyph_w = 5, glyph_h = 7, char_advance = 6;

namespace detail {

/// Rows of a glyph, top first, bit 4 = leftmost column. Lower case draws as upper case.
inline std::array<std::uint8_t, 7> glyph(char ch) {
  if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 'a' + 'A');
  static constexpr std::uint8_t digits[10][7] = {
      {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},
      {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},
      {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},
      {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},
      {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}};
  static constexpr std::uint8_t letters[26][7] = {
      {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11}, {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E},  // A B
      {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}, {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C},  // C D
      {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}, {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10},  // E F
      {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}, {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11},  // G H
      {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}, {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C},  // I J
      {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}, {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F},  // K L
      {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}, {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11},  // M N
      {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}, {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10},  // O P
      {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}, {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11},  // Q R
      {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}, {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04},  // S T
      {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}, {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04},  // U V
      {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}, {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11},  // W X
      {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}, {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}};  // Y Z
  auto rows = [](std::initializer_list<std::uint8_t> r) {
    std::array<std::uint8_t, 7> a{};
    std::copy(r.begin(), r.end(), a.begin());
    return a;
  };
  auto from = [](std::uint8_t const(&g)[7]) {
    std::array<std::uint8_t, 7> a{};
    std::copy(g, g + 7, a.begin());
    return a;
  };
  if (ch >= '0' && ch <= '9') return from(digits[ch - '0']);
  if (ch >= 'A' && ch <= 'Z') return from(letters[ch - 'A']);
  switch (ch) {
    case ' ': return rows({0, 0, 0, 0, 0, 0, 0});
    case '.': return rows({0, 0, 0, 0, 0, 0x0C, 0x0C});
    case ',': return rows({0, 0, 0, 0, 0x0C, 0x04, 0x08});
    case '-': return rows({0, 0, 0, 0x1F, 0, 0, 0});
    case '+': return rows({0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0});
    case ':': return rows({0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0});
    case '=': return rows({0, 0, 0x1F, 0, 0x1F, 0, 0});
    case '/': return rows({0, 0x01, 0x02, 0x04, 0x08, 0x10, 0});
    case '(': return rows({0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02});
    case ')': return rows({0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08});
    case '_': return rows({0, 0, 0, 0, 0, 0, 0x1F});
    case '%': return rows({0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03});
    case '^': return rows({0x04, 0x0A, 0x11, 0, 0, 0, 0});
    case '|': return rows({0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04});
    case '<': return rows({0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02});
    case '>': return rows({0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08});
    case '*': return rows({0, 0x04, 0x15, 0x0E, 0x15, 0x04, 0});
    case '\'': return rows({0x04, 0x04, 0x08, 0, 0, 0, 0});
    case ';': return rows({0, 0x0C, 0x0C, 0, 0x0C, 0x04, 0x08});
    case '!': return rows({0x04, 0x04, 0x04, 0x04, 0x04, 0, 0x04});
    case '?': return rows({0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04});
    case '[': return rows({0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E});
    case ']': return rows({0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E});
    case '#': return rows({0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A});
    case '"': return rows({0x0A, 0x0A, 0x0A, 0, 0, 0, 0});
    case '&': return rows({0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D});
    case '~': return rows({0, 0, 0x08, 0x15, 0x02, 0, 0});
    default: return rows({0x1F, 0x11, 0x15, 0x1D, 0x1B, 0x1F, 0x1B});  // no glyph: a '?' cut out of a box
  }
}

}  // namespace detail

/// True when `ch` has a glyph of its own (lower case letters draw as upper case).
inline bool has_glyph(char ch) {
  if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) return true;
  static std::string const signs = " .,-+:=/()_%^|<>*';!?[]#\"&~";
  return signs.find(ch) != std::string::npos;
}

/// Width in pixels of `text` drawn at `scale`.
inline int text_width(std::string const& text, int scale = 1) {
  return text.empty() ? 0 : (static_cast<int>(text.size()) * char_advance - 1) * scale;
}

/// Draws `text` with its top-left corner at (x, y); clipped at the image border.
inline void draw_text(image& img, int x, int y, std::string const& text, rgb color, int scale = 1) {
  for (char ch : text) {
    auto g = detail::glyph(ch);
    for (int r = 0; r < glyph_h; ++r)
      for (int c = 0; c < glyph_w; ++c)
        if (g[r] & (0x10 >> c)) img.fill_rect(x + c * scale, y + r * scale, scale, scale, color);
    x += char_advance * scale;
  }
}

// ---------------------------------------------------------------------------
// Ticks and number labels.

/// Tick values: multiples of a 1-2-5 step inside [lo, hi], about `target` of them.
inline std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi) || target < 1) return t;
  double raw = (hi - lo) / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double norm = raw / mag;
  double step = (norm < 1.5 ? 1.0 : norm < 3.0 ? 2.0 : norm < 7.0 ? 5.0 : 10.0) * mag;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

/// A short label for a tick value: "0.25", "-3", "1E-3", "2E4".
inline std::string tick_label(double v) {
  char buf[32];
  double a = std::abs(v);
  if (v == 0) return "0";
  if (a >= 1e4 || a < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0E", v);  // e.g. 1E-04, 2E+05
    std::string s = buf;
    auto e = s.find('E');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    bool neg = ex[0] == '-';
    ex = ex.substr(1);
    while (ex.size() > 1 && ex[0] == '0') ex.erase(0, 1);
    return mant + "E" + (neg ? "-" : "") + ex;
  }
  if (v == std::round(v)) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return buf;
}

// ---------------------------------------------------------------------------
// Heatmaps.

/// How a heatmap is drawn. Row r of the data is drawn r-th from the top.
struct heatmap_style {
  std::string title;             ///< first line above the map
  std::string axes;              ///< second line, e.g. "ROWS: QUERY  COLUMNS: KEY"
  int cell_w = 1, cell_h = 1;    ///< pixels per data cell
  bool diverging = false;        ///< signed data: RdBu, symmetric range around 0
  double vmin = std::numeric_limits<double>::quiet_NaN();  ///< NaN = from the data
  double vmax = std::numeric_limits<double>::quiet_NaN();  ///< NaN = from the data
  int x_first = 0, y_first = 0;  ///< label of column 0 / row 0 (e.g. a position offset)
};

/// Fixed margins, so an image's size depends only on the data's size and the cells.
struct heatmap_layout {
  static constexpr int left = 40;    // tick labels (up to 5 characters) + tick marks
  static constexpr int top = 28;     // two text lines
  static constexpr int bottom = 20;  // tick marks + labels
  static constexpr int right = 72;   // gap, colorbar (12 px), ticks, labels (up to 7 characters)
  static constexpr int colorbar_gap = 10, colorbar_w = 12;
};

/// Size in pixels of the image render_heatmap draws for (rows x cols) data.
inline std::pair<int, int> heatmap_size(int rows, int cols, heatmap_style const& s) {
  return {heatmap_layout::left + cols * s.cell_w + heatmap_layout::right,
          heatmap_layout::top + rows * s.cell_h + heatmap_layout::bottom};
}

/// Draws a (rows x cols) row-major table as a heatmap with a title, axis ticks
/// and a colorbar. Non-finite values are drawn gray (e.g. masked scores).
template <class T>
image render_heatmap(T const* values, int rows, int cols, heatmap_style const& s) {
  if (rows <= 0 || cols <= 0 || s.cell_w <= 0 || s.cell_h <= 0)
    throw std::invalid_argument("render_heatmap: rows, cols and cell sizes must be > 0");
  auto [w, h] = heatmap_size(rows, cols, s);
  image img(w, h);
  rgb const ink = hex(0x202020), gray = hex(0x9E9E9E);

  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (long i = 0; i < static_cast<long>(rows) * cols; ++i) {
    double v = static_cast<double>(values[i]);
    if (std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (!std::isfinite(lo)) lo = hi = 0;
  if (s.diverging) {
    double m = std::max(std::abs(lo), std::abs(hi));
    lo = -m;
    hi = m;
  }
  if (!std::isnan(s.vmin)) lo = s.vmin;
  if (!std::isnan(s.vmax)) hi = s.vmax;
  if (!(hi > lo)) hi = lo + 1;
  auto color = [&](double v) {
    if (!std::isfinite(v)) return gray;
    double t = (v - lo) / (hi - lo);
    return s.diverging ? diverging(2 * t - 1) : viridis(t);
  };

  int const x0 = heatmap_layout::left, y0 = heatmap_layout::top;
  int const pw = cols * s.cell_w, ph = rows * s.cell_h;
  draw_text(img, 4, 3, s.title, ink);
  draw_text(img, 4, 14, s.axes, hex(0x505050));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      img.fill_rect(x0 + c * s.cell_w, y0 + r * s.cell_h, s.cell_w, s.cell_h,
                    color(static_cast<double>(values[static_cast<long>(r) * cols + c])));

  // Axis ticks at cell centres, labels every nice step.
  for (double t : nice_ticks(0, cols - 1, std::max(1, std::min(6, pw / 40)))) {
    int c = static_cast<int>(std::lround(t));
    int x = x0 + c * s.cell_w + s.cell_w / 2;
    img.line(x, y0 + ph, x, y0 + ph + 3, ink);
    std::string lab = std::to_string(s.x_first + c);
    draw_text(img, x - text_width(lab) / 2, y0 + ph + 6, lab, ink);
  }
  for (double t : nice_ticks(0, rows - 1, std::max(1, std::min(6, ph / 24)))) {
    int r = static_cast<int>(std::lround(t));
    int y = y0 + r * s.cell_h + s.cell_h / 2;
    img.line(x0 - 4, y, x0 - 1, y, ink);
    std::string lab = std::to_string(s.y_first + r);
    draw_text(img, x0 - 7 - text_width(lab), y - glyph_h / 2, lab, ink);
  }

  // Colorbar: top = hi, bottom = lo, with its own ticks.
  int const cx = x0 + pw + heatmap_layout::colorbar_gap, cw = heatmap_layout::colorbar_w;
  for (int y = 0; y < ph; ++y) {
    double f = ph == 1 ? 1.0 : 1.0 - static_cast<double>(y) / (ph - 1);
    img.fill_rect(cx, y0 + y, cw, 1, color(lo + f * (hi - lo)));
  }
  for (double t : nice_ticks(lo, hi, std::max(1, std::min(5, ph / 24)))) {
    int y = y0 + static_cast<int>(std::lround((hi - t) / (hi - lo) * (ph - 1)));
    img.line(cx + cw, y, cx + cw + 3, y, ink);
    draw_text(img, cx + cw + 7, y - glyph_h / 2, tick_label(t), ink);
  }
  return img;
}

// ---------------------------------------------------------------------------
// Curves.

/// One curve of a line plot.
struct curve {
  std::string label;
  std::vector<double> x, y;
  rgb color;
};

/// A shaded band of a line plot (e.g. the spread over seeds): from lo to hi at each x, drawn
/// under the curves in `color` lightened to 25%.
struct band {
  std::vector<double> x, lo, hi;
  rgb color;
};

/// How a line plot is drawn.
struct plot_style {
  std::string title, axes;
  int width = 480, height = 240;  ///< the plot area in pixels
  bool log_x = false;             ///< log10 x axis (x must be > 0)
  int legend_width = 0;           ///< > 0: the legend in a column this wide right of the plot area
  std::vector<double> x_ticks;    ///< labelled x ticks (empty: chosen from the data)
  std::vector<double> x_marks;    ///< x values marked by a dashed vertical line
};

/// Fixed margins around the plot area of render_curves.
struct plot_layout {
  static constexpr int left = 48, top = 28, bottom = 20, right = 16;
};

/// Size in pixels of the image render_curves draws with style `s`.
inline std::pair<int, int> plot_size(plot_style const& s) {
  return {plot_layout::left + s.width + plot_layout::right + s.legend_width, plot_layout::top + s.height + plot_layout::bottom};
}

/// The legend width that fits the curves' labels (the swatch, a gap and the longest label).
inline int legend_width_for(std::vector<curve> const& curves) {
  int w = 0;
  for (auto const& c : curves) w = std::max(w, text_width(c.label));
  return w + 24;
}

/// c mixed with white: t = 0 gives c, t = 1 white.
inline rgb lighten(rgb c, double t) {
  auto mix = [t](std::uint8_t v) { return static_cast<std::uint8_t>(std::lround(v + t * (255.0 - v))); };
  return {mix(c.r), mix(c.g), mix(c.b)};
}

/// Draws the curves in one frame with ticks on both axes and a legend (top right of the plot
/// area, or right of it when s.legend_width > 0), over the bands (lightened to 25% of their
/// color). The y axis starts at 0 (or below, for negative data).
inline image render_curves(std::vector<curve> const& curves, plot_style const& s, std::vector<band> const& bands = {}) {
  auto [w, h] = plot_size(s);
  image img(w, h);
  rgb const ink = hex(0x202020), grid = hex(0xE4E4E4);
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  auto fx = [&](double x) { return s.log_x ? std::log10(x) : x; };
  for (auto const& c : curves)
    for (std::size_t i = 0; i < c.x.size() && i < c.y.size(); ++i) {
      if (!std::isfinite(fx(c.x[i])) || !std::isfinite(c.y[i])) continue;
      xlo = std::min(xlo, fx(c.x[i]));
      xhi = std::max(xhi, fx(c.x[i]));
      ylo = std::min(ylo, c.y[i]);
      yhi = std::max(yhi, c.y[i]);
    }
  for (auto const& b : bands)
    for (std::size_t i = 0; i < b.x.size() && i < b.lo.size() && i < b.hi.size(); ++i) {
      if (!std::isfinite(fx(b.x[i])) || !std::isfinite(b.lo[i]) || !std::isfinite(b.hi[i])) continue;
      xlo = std::min(xlo, fx(b.x[i]));
      xhi = std::max(xhi, fx(b.x[i]));
      ylo = std::min(ylo, b.lo[i]);
      yhi = std::max(yhi, b.hi[i]);
    }
  if (!(xhi > xlo)) xhi = xlo + 1;
  ylo = std::min(ylo, 0.0);
  if (!(yhi > ylo)) yhi = ylo + 1;
  int const x0 = plot_layout::left, y0 = plot_layout::top;
  auto px = [&](double x) { return x0 + static_cast<int>(std::lround((fx(x) - xlo) / (xhi - xlo) * (s.width - 1))); };
  auto py = [&](double y) {
    return y0 + s.height - 1 - static_cast<int>(std::lround((y - ylo) / (yhi - ylo) * (s.height - 1)));
  };
  draw_text(img, 4, 3, s.title, ink);
  draw_text(img, 4, 14, s.axes, hex(0x505050));

  std::vector<std::pair<double, std::string>> xt;
  if (!s.x_ticks.empty()) {
    for (double t : s.x_ticks)
      if (std::isfinite(fx(t)) && fx(t) >= xlo - 1e-9 && fx(t) <= xhi + 1e-9) xt.push_back({t, tick_label(t)});
  } else if (s.log_x) {
    for (int e = static_cast<int>(std::ceil(xlo - 1e-9)); e <= xhi + 1e-9; ++e)
      xt.push_back({std::pow(10.0, e), tick_label(std::pow(10.0, e))});
  } else {
    for (double t : nice_ticks(xlo, xhi, 6)) xt.push_back({t, tick_label(t)});
  }
  for (auto const& [v, lab] : xt) {
    int x = px(v);
    img.line(x, y0, x, y0 + s.height - 1, grid);
    img.line(x, y0 + s.height, x, y0 + s.height + 3, ink);
    draw_text(img, x - text_width(lab) / 2, y0 + s.height + 6, lab, ink);
  }
  for (double t : nice_ticks(ylo, yhi, 5)) {
    int y = py(t);
    img.line(x0, y, x0 + s.width - 1, y, grid);
    img.line(x0 - 4, y, x0 - 1, y, ink);
    std::string lab = tick_label(t);
    draw_text(img, x0 - 7 - text_width(lab), y - glyph_h / 2, lab, ink);
  }
  img.line(x0 - 1, y0, x0 - 1, y0 + s.height, ink);
  img.line(x0 - 1, y0 + s.height, x0 + s.width - 1, y0 + s.height, ink);

  // Bands: each pixel column between two points, filled from the interpolated low to high.
  for (auto const& b : bands) {
    rgb const fill = lighten(b.color, 0.75);
    for (std::size_t i = 0; i + 1 < b.x.size() && i + 1 < b.lo.size() && i + 1 < b.hi.size(); ++i) {
      double const a[4] = {b.lo[i], b.hi[i], b.lo[i + 1], b.hi[i + 1]};
      if (!std::isfinite(fx(b.x[i])) || !std::isfinite(fx(b.x[i + 1])) || !std::all_of(a, a + 4, [](double v) { return std::isfinite(v); }))
        continue;
      int const xa = px(b.x[i]), xb = px(b.x[i + 1]);
      for (int x = xa; x <= xb; ++x) {
        double f = xb == xa ? 0.0 : static_cast<double>(x - xa) / (xb - xa);
        int top = py(a[1] + f * (a[3] - a[1])), bottom = py(a[0] + f * (a[2] - a[0]));
        img.fill_rect(x, top, 1, bottom - top + 1, fill);
      }
    }
  }
  for (double m : s.x_marks) {
    if (!std::isfinite(fx(m)) || fx(m) < xlo || fx(m) > xhi) continue;
    for (int y = y0; y < y0 + s.height; y += 6) img.line(px(m), y, px(m), std::min(y + 2, y0 + s.height - 1), hex(0x707070));
  }

  for (auto const& c : curves) {
    bool have = false;
    int lx = 0, ly = 0;
    for (std::size_t i = 0; i < c.x.size() && i < c.y.size(); ++i) {
      if (!std::isfinite(fx(c.x[i])) || !std::isfinite(c.y[i])) continue;
      int x = px(c.x[i]), y = py(c.y[i]);
      if (have) {
        img.line(lx, ly, x, y, c.color);
        img.line(lx, ly + 1, x, y + 1, c.color);
      }
      have = true;
      lx = x;
      ly = y;
    }
  }
  int ly = y0 + 6;
  for (auto const& c : curves) {
    int lw = text_width(c.label);
    int lx = s.legend_width > 0 ? x0 + s.width + plot_layout::right + 20 : x0 + s.width - 8 - lw;
    img.fill_rect(lx - 16, ly + 2, 12, 3, c.color);
    draw_text(img, lx, ly, c.label, ink);
    ly += 11;
  }
  return img;
}

// ---------------------------------------------------------------------------
// Composition.

/// Size of side_by_side(images with these sizes, columns, gap).
inline std::pair<int, int> grid_size(std::vector<std::pair<int, int>> const& sizes, int columns, int gap) {
  int n = static_cast<int>(sizes.size());
  if (n == 0 || columns <= 0) throw std::invalid_argument("grid_size: no images or columns <= 0");
  int cw = 0, ch = 0;
  for (auto [w, h] : sizes) {
    cw = std::max(cw, w);
    ch = std::max(ch, h);
  }
  int cols = std::min(columns, n), rows = (n + columns - 1) / columns;
  return {cols * cw + (cols + 1) * gap, rows * ch + (rows + 1) * gap};
}

/// The images on a grid of `columns` columns, each in a cell of the largest size.
inline image side_by_side(std::vector<image> const& images, int columns, int gap = 8) {
  std::vector<std::pair<int, int>> sizes;
  for (auto const& i : images) sizes.push_back({i.width(), i.height()});
  auto [w, h] = grid_size(sizes, columns, gap);
  int cw = 0, ch = 0;
  for (auto [iw, ih] : sizes) {
    cw = std::max(cw, iw);
    ch = std::max(ch, ih);
  }
  image out(w, h, hex(0xFFFFFF));
  for (std::size_t k = 0; k < images.size(); ++k) {
    int c = static_cast<int>(k) % columns, r = static_cast<int>(k) / columns;
    out.blit(images[k], gap + c * (cw + gap), gap + r * (ch + gap));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Files.

/// Writes `img` as an 8-bit RGB PNG; throws std::runtime_error when it cannot.
/// Defined in png.cpp (the one translation unit that compiles stb_image_write).
void write_png(std::string const& path, image const& img);

/// What the first 33 bytes of a PNG file say.
struct png_header {
  bool valid = false;   ///< signature, IHDR chunk and its CRC all correct
  std::string problem;  ///< why not, when !valid
  std::uint32_t width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
};

namespace detail {
inline std::uint32_t crc32(std::uint8_t const* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}
inline std::uint32_t be32(std::uint8_t const* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
}  // namespace detail

/// Reads and checks the PNG signature and the IHDR chunk (length 13, CRC) of `path`.
inline png_header read_png_header(std::string const& path) {
  png_header h;
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    h.problem = "cannot open " + path;
    return h;
  }
  std::uint8_t b[33] = {};
  f.read(reinterpret_cast<char*>(b), sizeof b);
  if (f.gcount() != static_cast<std::streamsize>(sizeof b)) {
    h.problem = "shorter than a PNG signature and IHDR chunk";
    return h;
  }
  static constexpr std::uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (!std::equal(sig, sig + 8, b)) {
    h.problem = "no PNG signature";
    return h;
  }
  if (detail::be32(b + 8) != 13 || b[12] != 'I' || b[13] != 'H' || b[14] != 'D' || b[15] != 'R') {
    h.problem = "first chunk is not a 13-byte IHDR";
    return h;
  }
  if (detail::crc32(b + 12, 17) != detail::be32(b + 29)) {
    h.problem = "IHDR CRC mismatch";
    return h;
  }
  h.width = detail::be32(b + 16);
  h.height = detail::be32(b + 20);
  h.bit_depth = b[24];
  h.color_type = b[25];
  h.valid = h.width > 0 && h.height > 0;
  if (!h.valid) h.problem = "zero width or height";
  return h;
}

}  // namespace posenc_examples
