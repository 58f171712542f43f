// SPDX-License-Identifier: MIT
// Reader for the checked-in golden files under tests/golden/data/.
//
// Format (written by the generator scripts in tests/golden/): one record per
// line, `<name> <count> <v0> <v1> ...`, values as %.17g (parsed with strtod,
// so inf/nan are allowed); lines starting with '#' are comments.
#pragma once

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace posenc_test {

using golden_file = std::map<std::string, std::vector<double>>;

/// Path of a golden file by name: <tests/golden/data>/<file>.
inline std::string golden_path(std::string const& file) {
#ifdef POSENC_GOLDEN_DIR
  return std::string(POSENC_GOLDEN_DIR) + "/" + file;
#else
  return "tests/golden/data/" + file;
#endif
}

/// Reads every record of a golden file; throws std::runtime_error when missing or malformed.
inline golden_file read_golden(std::string const& file) {
  std::ifstream in(golden_path(file));
  if (!in) throw std::runtime_error("cannot open golden file " + golden_path(file));
  golden_file out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name;
    long long count = 0;
    ls >> name >> count;
    std::string tok;
    std::vector<double> vals;
    vals.reserve(static_cast<std::size_t>(count));
    while (ls >> tok) vals.push_back(std::strtod(tok.c_str(), nullptr));
    if (static_cast<long long>(vals.size()) != count)
      throw std::runtime_error("golden record " + name + " in " + file + ": expected " +
                               std::to_string(count) + " values, read " + std::to_string(vals.size()));
    out[name] = std::move(vals);
  }
  return out;
}

/// The record `name`; throws when absent.
inline std::vector<double> const& golden_record(golden_file const& g, std::string const& name) {
  auto it = g.find(name);
  if (it == g.end()) throw std::runtime_error("golden record missing: " + name);
  return it->second;
}

/// The record `name` as a rows x cols table of type Table (anything constructible
/// as Table(rows, cols) with element access t(r, c), e.g. posenc::relative_table<T>),
/// read row-major; throws when absent or of another size.
template <class Table, class Index>
Table golden_table(golden_file const& g, std::string const& name, Index rows, Index cols) {
  std::vector<double> const& v = golden_record(g, name);
  if (static_cast<long long>(v.size()) != static_cast<long long>(rows) * static_cast<long long>(cols))
    throw std::runtime_error("golden record " + name + ": expected " + std::to_string(rows) + " x " +
                             std::to_string(cols) + " values, found " + std::to_string(v.size()));
  Table t(rows, cols);
  for (Index r = 0; r < rows; ++r)
    for (Index c = 0; c < cols; ++c) {
      using E = std::decay_t<decltype(t(r, c))>;
      t(r, c) = static_cast<E>(v[static_cast<std::size_t>(r * cols + c)]);
    }
  return t;
}

}  // namespace posenc_test
