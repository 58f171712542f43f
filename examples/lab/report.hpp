// SPDX-License-Identifier: MIT
// Reporting helpers of the experiments: markdown tables, number formats, peak memory.
#pragma once

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace lab {

/// A markdown table built row by row.
class md_table {
 public:
  explicit md_table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const {
    std::string s = line(header_) + "|";
    for (std::size_t i = 0; i < header_.size(); ++i) s += "---|";
    s += "\n";
    for (auto const& r : rows_) s += line(r);
    return s;
  }

 private:
  static std::string line(std::vector<std::string> const& r) {
    std::string s = "|";
    for (auto const& c : r) s += " " + c + " |";
    return s + "\n";
  }
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

/// printf-style formatting into a std::string.
template <class... A>
std::string fmt(char const* f, A... a) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

/// "n/a" for NaN, else the number with `f`.
inline std::string num(double v, char const* f = "%.2f") { return std::isnan(v) ? "n/a" : fmt(f, v); }

/// Forgets the process's peak resident set (Linux: /proc/self/clear_refs "5"); false when unsupported.
inline bool reset_peak_memory() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  return static_cast<bool>(f.flush());
}

/// The value of the line starting with `key` in a /proc file of kB values, in MiB; NaN when unknown.
inline double proc_mib(char const* file, std::string const& key) {
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size())) / 1024.0;
  return std::nan("");
}

/// Peak resident set in MiB since the last reset (VmHWM), NaN when unknown.
inline double peak_memory_mib() { return proc_mib("/proc/self/status", "VmHWM:"); }

/// Memory available to new processes in MiB (MemAvailable), NaN when unknown.
inline double available_memory_mib() { return proc_mib("/proc/meminfo", "MemAvailable:"); }

/// Writes text to path (throws std::runtime_error when it cannot).
inline void write_text(std::string const& path, std::string const& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw std::runtime_error("lab: cannot write " + path);
}

}  // namespace lab
