// SPDX-License-Identifier: MIT
// Reader for the plain-text ONNX conformance cases in ../shared/conformance/onnx
// (format: that folder's README). The data is read at test time, never copied.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/catch.hpp"

namespace posenc_test {

struct onnx_tensor {
  std::string name;
  bool present = false;
  std::string dtype;             // float32, float16, int64, bool, ...
  std::vector<long long> dims;
  std::vector<double> values;    // every value widened to double (ints exact below 2^53)
};

struct onnx_case {
  std::string name, op;
  int opset = 0;
  std::map<std::string, std::vector<std::string>> attrs;  // attribute -> value tokens
  std::vector<onnx_tensor> inputs, outputs;               // indexed by formal position

  bool has_attr(std::string const& a) const { return attrs.count(a) != 0; }
  double attr_num(std::string const& a, double dflt) const {
    auto it = attrs.find(a);
    return it == attrs.end() ? dflt : std::strtod(it->second.at(0).c_str(), nullptr);
  }
  onnx_tensor const* input(std::size_t i) const {
    return i < inputs.size() && inputs[i].present ? &inputs[i] : nullptr;
  }
  onnx_tensor const* output(std::size_t i) const {
    return i < outputs.size() && outputs[i].present ? &outputs[i] : nullptr;
  }
};

/// Folder of the ONNX cases: $POSENC_ONNX_DIR, else the compiled-in default
/// (../shared/conformance/onnx beside the source tree). Empty when absent.
inline std::string onnx_dir() {
  std::string dir;
  if (char const* env = std::getenv("POSENC_ONNX_DIR")) dir = env;
#ifdef POSENC_ONNX_DEFAULT_DIR
  if (dir.empty()) dir = POSENC_ONNX_DEFAULT_DIR;
#endif
  if (dir.empty()) return {};
  std::ifstream probe(dir + "/index.txt");
  return probe ? dir : std::string{};
}

/// Exit status of a test program whose data is absent; ctest reports such a test as
/// skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
inline constexpr int skip_return_code = 77;

/// True when $POSENC_REQUIRE_ONNX is set to anything but "" or "0" (scripts/test.sh sets it
/// under CI, where the conformance data is always present).
inline bool onnx_required() {
  char const* env = std::getenv("POSENC_REQUIRE_ONNX");
  return env != nullptr && *env != '\0' && std::string(env) != "0";
}

/// The folder of the ONNX cases, for a test case that needs them. When it is absent the
/// test fails if onnx_required(), else the program prints why and exits with
/// skip_return_code: no test reports "passed" without having compared anything.
inline std::string onnx_dir_or_skip() {
  std::string dir = onnx_dir();
  if (!dir.empty()) return dir;
  if (onnx_required())
    FAIL("ONNX conformance data not found ($POSENC_ONNX_DIR or ../shared/conformance/onnx) "
         "and POSENC_REQUIRE_ONNX is set");
  std::printf("ONNX conformance data not found ($POSENC_ONNX_DIR or ../shared/conformance/onnx): skipped\n");
  std::fflush(stdout);
  std::exit(skip_return_code);
}

/// Case names listed in index.txt that start with `prefix`.
inline std::vector<std::string> onnx_case_names(std::string const& dir, std::string const& prefix) {
  std::vector<std::string> names;
  std::ifstream in(dir + "/index.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind(prefix, 0) == 0) names.push_back(line);
  }
  return names;
}

namespace detail {
inline void read_tensor_header(std::istringstream& hs, onnx_tensor& t) {
  std::string idx;
  hs >> idx >> t.name;
  std::string dtype;
  hs >> dtype;
  if (dtype == "absent") return;
  t.present = true;
  t.dtype = dtype;
  long long rank = 0;
  hs >> rank;
  t.dims.resize(static_cast<std::size_t>(rank));
  for (auto& d : t.dims) hs >> d;
}
inline void read_values(std::string const& line, onnx_tensor& t) {
  char const* p = line.c_str();
  char* end = nullptr;
  while (true) {
    double v = std::strtod(p, &end);  // accepts inf, -inf, nan
    if (end == p) break;
    t.values.push_back(v);
    p = end;
  }
}
}  // namespace detail

/// Parses one case file; throws std::runtime_error when it cannot.
inline onnx_case read_onnx_case(std::string const& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  onnx_case c;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kw;
    ls >> kw;
    if (kw == "case") {
      ls >> c.name;
    } else if (kw == "op") {
      std::string opset_kw;
      ls >> c.op >> opset_kw >> c.opset;
    } else if (kw == "attr") {
      std::string name, tok;
      ls >> name;
      auto& vals = c.attrs[name];
      while (ls >> tok) vals.push_back(tok);
    } else if (kw == "input" || kw == "output") {
      std::string rest = line.substr(kw.size());
      std::istringstream hs(rest);
      onnx_tensor t;
      std::istringstream idxs(rest);
      std::size_t idx = 0;
      idxs >> idx;
      detail::read_tensor_header(hs, t);
      if (t.present) {
        std::string values;
        std::getline(in, values);
        detail::read_values(values, t);
      }
      auto& vec = kw == "input" ? c.inputs : c.outputs;
      if (vec.size() <= idx) vec.resize(idx + 1);
      vec[idx] = std::move(t);
    }
  }
  return c;
}

}  // namespace posenc_test
