// SPDX-License-Identifier: MIT
// The one translation unit that compiles stb_image_write, and write_png on top of it.
#define STB_IMAGE_WRITE_IMPLEMENTATION
#if __has_include(<stb_image_write.h>)
#include <stb_image_write.h>
#else
#include <stb/stb_image_write.h>
#endif

#include "png.hpp"

namespace posenc_examples {

void write_png(std::string const& path, image const& img) {
  if (img.width() <= 0 || img.height() <= 0) throw std::runtime_error("write_png: empty image for " + path);
  if (!stbi_write_png(path.c_str(), img.width(), img.height(), 3, img.data(), img.width() * 3))
    throw std::runtime_error("write_png: cannot write " + path);
}

}  // namespace posenc_examples
