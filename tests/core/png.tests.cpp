// SPDX-License-Identifier: MIT
// The examples' PNG layer: published colormap values, font, layout sizes, and files that are valid PNG.
#include "support/catch.hpp"

#if __has_include(<stb/stb_image_write.h>) || __has_include(<stb_image_write.h>)
#define POSENC_TEST_HAS_STB 1
// This test is its own stb_image_write translation unit (png.cpp defines the implementation).
#include "../../examples/support/png.cpp"
#else
#define POSENC_TEST_HAS_STB 0
#endif

#if POSENC_TEST_HAS_STB

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace px = posenc_examples;

namespace {
std::string hex_of(px::rgb c) {
  char b[8];
  std::snprintf(b, sizeof b, "%02X%02X%02X", c.r, c.g, c.b);
  return b;
}
}  // namespace

TEST_CASE("viridis endpoints are the published #440154 and #FDE725") {
  CHECK(hex_of(px::viridis(0.0)) == "440154");
  CHECK(hex_of(px::viridis(1.0)) == "FDE725");
  CHECK(px::viridis(0.0) == px::hex(px::viridis_first));
  CHECK(px::viridis(1.0) == px::hex(px::viridis_last));
  // Clamped outside [0, 1], NaN reads as 0.
  CHECK(px::viridis(-3.0) == px::hex(px::viridis_first));
  CHECK(px::viridis(7.0) == px::hex(px::viridis_last));
  CHECK(px::viridis(std::nan("")) == px::hex(px::viridis_first));
  // Entry 128 of the published 256-entry table is (0.127568, 0.566949, 0.550556) = #21918C.
  CHECK(hex_of(px::viridis(128.0 / 255.0)) == "21918C");
}

TEST_CASE("viridis gets lighter monotonically (perceptual ordering)") {
  double last = -1;
  for (int i = 0; i <= 100; ++i) {
    px::rgb c = px::viridis(i / 100.0);
    double luma = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    CHECK(luma >= last - 0.5);
    last = luma;
  }
}

TEST_CASE("diverging map: ColorBrewer RdBu reversed, #053061 .. #F7F7F7 .. #67001F") {
  CHECK(hex_of(px::diverging(-1.0)) == "053061");
  CHECK(hex_of(px::diverging(0.0)) == "F7F7F7");
  CHECK(hex_of(px::diverging(1.0)) == "67001F");
  CHECK(px::diverging(-5.0) == px::hex(px::diverging_negative));
  CHECK(px::diverging(5.0) == px::hex(px::diverging_positive));
  // Control point 3 of 11 (t = -0.4) is #92C5DE; negatives are blue, positives red.
  CHECK(hex_of(px::diverging(-0.4)) == "92C5DE");
  px::rgb neg = px::diverging(-0.5), pos = px::diverging(0.5);
  CHECK(neg.b > neg.r);
  CHECK(pos.r > pos.b);
}

TEST_CASE("nice ticks and tick labels") {
  auto t = px::nice_ticks(0, 127, 5);
  REQUIRE(t.size() >= 3);
  CHECK(t.front() == 0);
  CHECK(t.back() <= 127);
  CHECK(px::tick_label(0.25) == "0.25");
  CHECK(px::tick_label(-3) == "-3");
  CHECK(px::tick_label(1e-4) == "1E-4");
  CHECK(px::tick_label(100000) == "1E5");
  CHECK(px::tick_label(20000) == "2E4");
  CHECK(px::tick_label(1000) == "1000");
}

TEST_CASE("the 5x7 font draws known glyphs") {
  px::image img(20, 10);
  px::draw_text(img, 0, 0, "1", px::hex(0x000000));
  // '1': rows 0x04 0x0C 0x04 0x04 0x04 0x04 0x0E -> column 2 set in every row, (1,1) set, (0,0) clear.
  for (int r = 0; r < 7; ++r) CHECK(img.get(2, r) == px::hex(0x000000));
  CHECK(img.get(1, 1) == px::hex(0x000000));
  CHECK(img.get(0, 0) == px::hex(0xFFFFFF));
  CHECK(px::text_width("ABC") == 17);
}

TEST_CASE("heatmap: size from the layout, colorbar ends at the colormap ends") {
  std::vector<float> v(6 * 10);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  px::heatmap_style s;
  s.cell_w = 4;
  s.cell_h = 5;
  px::image img = px::render_heatmap(v.data(), 6, 10, s);
  CHECK(img.width() == px::heatmap_layout::left + 40 + px::heatmap_layout::right);
  CHECK(img.height() == px::heatmap_layout::top + 30 + px::heatmap_layout::bottom);
  int x0 = px::heatmap_layout::left, y0 = px::heatmap_layout::top;
  // First cell = minimum = viridis(0), last cell = maximum = viridis(1).
  CHECK(img.get(x0, y0) == px::hex(px::viridis_first));
  CHECK(img.get(x0 + 39, y0 + 29) == px::hex(px::viridis_last));
  int cx = x0 + 40 + px::heatmap_layout::colorbar_gap + 1;
  CHECK(img.get(cx, y0) == px::hex(px::viridis_last));
  CHECK(img.get(cx, y0 + 29) == px::hex(px::viridis_first));

  // Signed data: symmetric range, zero is the diverging midpoint.
  std::vector<double> d = {-2, 0, 1, 2};
  s.diverging = true;
  s.cell_w = s.cell_h = 3;
  px::image sd = px::render_heatmap(d.data(), 2, 2, s);
  CHECK(sd.get(x0, y0) == px::hex(px::diverging_negative));
  CHECK(sd.get(x0 + 3, y0) == px::hex(px::diverging_zero));
  CHECK(sd.get(x0 + 3, y0 + 3) == px::hex(px::diverging_positive));
}

TEST_CASE("write_png writes a valid PNG with the IHDR size of the image") {
  px::image img(37, 11, px::hex(0x123456));
  img.set(3, 4, px::hex(0xFF0000));
  std::string path = "posenc_png_test_37x11.png";
  px::write_png(path, img);
  px::png_header h = px::read_png_header(path);
  INFO(h.problem);
  REQUIRE(h.valid);
  CHECK(h.width == 37u);
  CHECK(h.height == 11u);
  CHECK(h.bit_depth == 8);
  CHECK(h.color_type == 2);  // truecolor RGB

  // The checker rejects a file whose signature or IHDR is damaged.
  std::string bad = "posenc_png_test_bad.png";
  {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes[18] ^= 0x01;  // a width byte: the IHDR CRC no longer matches
    std::ofstream out(bad, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  CHECK_FALSE(px::read_png_header(bad).valid);
  CHECK_FALSE(px::read_png_header("posenc_png_test_missing.png").valid);
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

TEST_CASE("write_png reports a path it cannot write") {
  px::image img(2, 2);
  REQUIRE_THROWS_AS(px::write_png("/nonexistent-folder/x.png", img), std::runtime_error);
}

#else

TEST_CASE("PNG layer") { WARN("skipped: stb_image_write.h not found (install libstb-dev)"); }

#endif
