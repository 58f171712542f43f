// SPDX-License-Identifier: MIT
// Checks the tour's pictures: each file exists, is a valid PNG, decodes, and has the expected size.
//
// The expected sizes follow from the data each picture shows (positions x
// dims, queries x keys, ...) and the fixed margins of png.hpp, not from the
// tour's own code: a picture with a row too few or too many fails here.
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#if __has_include(<stb_image.h>)
#include <stb_image.h>
#else
#include <stb/stb_image.h>
#endif

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "png.hpp"

namespace px = posenc_examples;

namespace {

std::pair<int, int> heat(int rows, int cols, int cell_w, int cell_h) {
  px::heatmap_style s;
  s.cell_w = cell_w;
  s.cell_h = cell_h;
  return px::heatmap_size(rows, cols, s);
}

struct expected {
  std::string file;
  std::pair<int, int> size;
};

std::vector<expected> expected_pictures() {
  std::vector<expected> e;
  // The sinusoidal table: positions 0..127 x dims 0..511, one pixel per value.
  e.push_back({"sinusoidal_table.png", heat(128, 512, 1, 1)});
  // One attention map per encoder: 12 queries x 12 keys, 16 px per cell; then all of them, 5 per row.
  std::vector<std::pair<int, int>> maps;
  for (char const* name : {"none", "sinusoidal", "learned", "rope", "rope_yarn", "alibi", "t5", "clipped",
                           "shaw", "rope_alibi", "transformer_xl"}) {
    e.push_back({std::string("attention_") + name + ".png", heat(12, 12, 16, 16)});
    maps.push_back(heat(12, 12, 16, 16));
  }
  e.push_back({"attention_all.png", px::grid_size(maps, 5, 8)});
  // Transformer-XL's content term, position term and their sum: three maps in one row.
  e.push_back({"transformer_xl_terms.png", px::grid_size(std::vector<std::pair<int, int>>(3, heat(12, 12, 16, 16)), 3, 8)});
  // T5 buckets: 128 queries x 128 keys, 2 px per cell.
  e.push_back({"t5_buckets.png", heat(128, 128, 2, 2)});
  // ALiBi: four heads of 32 queries x 32 keys, 4 px per cell, in one row.
  e.push_back({"alibi_bias.png", px::grid_size(std::vector<std::pair<int, int>>(4, heat(32, 32, 4, 4)), 4, 8)});
  // RoPE long-term decay: one plot.
  e.push_back({"rope_decay.png", px::plot_size(px::plot_style{})});
  // Learned table (128 positions x 32 dims) beside its interpolation to 256 positions, same height.
  e.push_back({"learned_interpolation.png", px::grid_size({heat(128, 32, 4, 2), heat(256, 32, 4, 1)}, 2, 8)});
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <tour output folder>\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  int failures = 0;
  for (auto const& e : expected_pictures()) {
    std::string path = dir + "/" + e.file;
    px::png_header h = px::read_png_header(path);
    if (!h.valid) {
      std::printf("FAIL %s: %s\n", path.c_str(), h.problem.c_str());
      ++failures;
      continue;
    }
    int w = 0, hh = 0, comp = 0;
    unsigned char* pixels = stbi_load(path.c_str(), &w, &hh, &comp, 0);
    if (!pixels) {
      std::printf("FAIL %s: does not decode (%s)\n", path.c_str(), stbi_failure_reason());
      ++failures;
      continue;
    }
    stbi_image_free(pixels);
    // The same files go to docs/img, where each must stay under 200 KB.
    auto const bytes = std::filesystem::file_size(path);
    bool ok = static_cast<int>(h.width) == e.size.first && static_cast<int>(h.height) == e.size.second &&
              w == e.size.first && hh == e.size.second && bytes < 200 * 1024;
    std::printf("%s %s: IHDR %ux%u, decoded %dx%d, expected %dx%d, %ju bytes (limit 204800)\n",
                ok ? "ok  " : "FAIL", path.c_str(), h.width, h.height, w, hh, e.size.first, e.size.second,
                static_cast<std::uintmax_t>(bytes));
    if (!ok) ++failures;
  }
  std::printf("%d picture(s) wrong\n", failures);
  return failures == 0 ? 0 : 1;
}
