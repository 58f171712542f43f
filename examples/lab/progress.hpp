// SPDX-License-Identifier: MIT
// Progress of a long command: one line per finished run, with the time so far and an estimate
// of what remains (posenc_lab writes it to stderr; --quiet turns it off).
#pragma once

#include "report.hpp"

#include <chrono>
#include <ostream>
#include <string>

namespace lab {

/// Counts finished runs out of a known total and reports each one to a stream (none: silent).
class progress {
 public:
  /// @param out where the lines go (nullptr: nowhere); @param total the runs expected.
  progress(std::ostream* out, int total) : out_(out), total_(total), start_(std::chrono::steady_clock::now()) {}

  /// Reports a finished run: "[k/total] run: result (s s); elapsed e s, about r s left", where r
  /// is the mean time per run so far times the runs still to come.
  void done(std::string const& run, std::string const& result) {
    ++done_;
    double const now = seconds_since(start_);
    double const this_run = now - last_;
    last_ = now;
    if (!out_) return;
    double const left = done_ < total_ ? now / done_ * (total_ - done_) : 0.0;
    *out_ << "[" << done_ << "/" << total_ << "] " << run << ": " << result << " (" << fmt("%.1f", this_run) << " s); elapsed "
          << fmt("%.0f", now) << " s, about " << fmt("%.0f", left) << " s left" << std::endl;
  }
  int finished() const { return done_; }

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  std::ostream* out_;
  int total_, done_ = 0;
  std::chrono::steady_clock::time_point start_;
  double last_ = 0;
};

}  // namespace lab
