// SPDX-License-Identifier: MIT
// Checkpoints: a model's configuration and parameters in a small checked binary format.
//
// Layout (little-endian, no padding):
//   offset  size  field
//   0       8     magic "PNCLAB\r\n" (the \r\n catches text-mode mangling)
//   8       4     u32 format version (2)
//   12      4     u32 bytes per parameter (4: float, 8: double)
//   16      48    12 x i32: layers, d_model, heads, seq, batch, mlp, split,
//                 lower absolute, lower attention, upper absolute, upper attention,
//                 embedding setup (config.hpp enums)
//   64      8     u64 seed
//   72      8     u64 training steps done
//   80      8     u64 parameter count n (must equal what the config implies)
//   88      n*b   parameters in the model's layout order (model.hpp build_layout)
//   88+n*b  8     u64 FNV-1a hash of the parameter bytes
// Anything else (a foreign file, another version, a truncated file, a changed byte) is
// rejected with a std::runtime_error saying which.
#pragma once

#include "model.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

namespace lab {

inline constexpr char checkpoint_magic[8] = {'P', 'N', 'C', 'L', 'A', 'B', '\r', '\n'};
inline constexpr std::uint32_t checkpoint_version = 2;

namespace detail {
inline std::uint64_t fnv1a(void const* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char const*>(p)[i]) * 1099511628211ull;
  return h;
}
template <class V>
void put(std::ofstream& f, V v) {
  f.write(reinterpret_cast<char const*>(&v), sizeof v);
}
inline void fail(std::string const& path, std::string const& what) {
  throw std::runtime_error("lab::load_checkpoint: " + path + ": " + what);
}
template <class V>
V get(std::ifstream& f, std::string const& path, char const* field) {
  V v{};
  if (!f.read(reinterpret_cast<char*>(&v), sizeof v)) fail(path, std::string("truncated in the header (") + field + ")");
  return v;
}
}  // namespace detail

/// Writes m (trained for `steps` steps) to path; throws std::runtime_error when it cannot.
template <class T>
void save_checkpoint(std::string const& path, model<T> const& m, std::uint64_t steps) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("lab::save_checkpoint: cannot open " + path);
  config const& c = m.cfg();
  f.write(checkpoint_magic, sizeof checkpoint_magic);
  detail::put(f, checkpoint_version);
  detail::put(f, static_cast<std::uint32_t>(sizeof(T)));
  for (int v : {c.layers, c.d_model, c.heads, c.seq, c.batch, c.mlp, c.split, static_cast<int>(c.lower.absolute),
                static_cast<int>(c.lower.attention), static_cast<int>(c.upper.absolute), static_cast<int>(c.upper.attention),
                static_cast<int>(c.embedding)})
    detail::put(f, static_cast<std::int32_t>(v));
  detail::put(f, static_cast<std::uint64_t>(c.seed));
  detail::put(f, steps);
  auto const& p = m.params();
  detail::put(f, static_cast<std::uint64_t>(p.size()));
  f.write(reinterpret_cast<char const*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(T)));
  detail::put(f, detail::fnv1a(p.data(), p.size() * sizeof(T)));
  if (!f) throw std::runtime_error("lab::save_checkpoint: writing " + path + " failed");
}

/// A checkpoint's model and the steps it was trained for.
template <class T>
struct loaded {
  model<T> net;
  std::uint64_t steps = 0;
};

/// Reads a checkpoint written by save_checkpoint<T>; throws std::runtime_error naming the problem.
template <class T>
loaded<T> load_checkpoint(std::string const& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) detail::fail(path, "cannot open");
  char magic[8] = {};
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, checkpoint_magic, sizeof magic) != 0)
    detail::fail(path, "not a lab checkpoint (magic bytes differ)");
  auto version = detail::get<std::uint32_t>(f, path, "version");
  if (version != checkpoint_version)
    detail::fail(path, "format version is " + std::to_string(version) + ", expected " + std::to_string(checkpoint_version));
  auto bytes = detail::get<std::uint32_t>(f, path, "bytes per parameter");
  if (bytes != sizeof(T)) detail::fail(path, "bytes per parameter is " + std::to_string(bytes) + ", expected " + std::to_string(sizeof(T)));
  std::int32_t v[12];
  for (auto& x : v) x = detail::get<std::int32_t>(f, path, "config");
  config c;
  c.layers = v[0], c.d_model = v[1], c.heads = v[2], c.seq = v[3], c.batch = v[4], c.mlp = v[5], c.split = v[6];
  for (int i = 7; i < 11; ++i)
    if (v[i] < 0 || v[i] > 6) detail::fail(path, "encoding field " + std::to_string(i - 7) + " is " + std::to_string(v[i]) + ", expected 0 .. 6");
  c.lower = {static_cast<absolute_kind>(v[7]), static_cast<attention_kind>(v[8])};
  c.upper = {static_cast<absolute_kind>(v[9]), static_cast<attention_kind>(v[10])};
  if (v[11] < 0 || v[11] >= static_cast<int>(embedding_setup_names().size()))
    detail::fail(path, "embedding setup is " + std::to_string(v[11]) + ", expected 0 .. " + std::to_string(embedding_setup_names().size() - 1));
  c.embedding = static_cast<embedding_setup>(v[11]);
  c.seed = detail::get<std::uint64_t>(f, path, "seed");
  auto steps = detail::get<std::uint64_t>(f, path, "steps");
  auto n = detail::get<std::uint64_t>(f, path, "parameter count");
  try {
    c.check();
  } catch (std::exception const& e) {
    detail::fail(path, std::string("bad configuration: ") + e.what());
  }
  loaded<T> out{model<T>(c), steps};
  auto& p = out.net.params();
  if (n != p.size()) detail::fail(path, "parameter count is " + std::to_string(n) + ", expected " + std::to_string(p.size()) + " for its configuration");
  f.read(reinterpret_cast<char*>(p.data()), static_cast<std::streamsize>(n * sizeof(T)));
  if (static_cast<std::uint64_t>(f.gcount()) != n * sizeof(T))
    detail::fail(path, "truncated: " + std::to_string(f.gcount()) + " of " + std::to_string(n * sizeof(T)) + " parameter bytes");
  std::uint64_t hash = 0;
  if (!f.read(reinterpret_cast<char*>(&hash), sizeof hash)) detail::fail(path, "truncated: the hash after the parameters is missing");
  if (hash != detail::fnv1a(p.data(), p.size() * sizeof(T))) detail::fail(path, "parameter hash differs: the file is corrupt");
  if (f.peek() != std::char_traits<char>::eof()) detail::fail(path, "bytes after the hash: not a file save_checkpoint wrote");
  return out;
}

}  // namespace lab
