// SPDX-License-Identifier: MIT
// The training text: Debian's fortunes-min files, split by record into train / validation / test.
#pragma once

#include "model.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace lab {

/// Where the corpus is read from (Debian package fortunes-min, installed by scripts/deps.sh).
inline std::string default_corpus_dir() { return "/usr/share/games/fortunes"; }

/// The three parts of the corpus and where they came from.
struct corpus {
  std::string source;
  std::size_t total_bytes = 0;
  std::string train, validation, test;
};

namespace detail {
/// Splits `text` at its "%" record separators into c, counting records from `record`: record i
/// goes to validation when i % 10 == 8, to test when i % 10 == 9, else to train.
inline void split_records(corpus& c, std::string const& text, std::size_t& record) {
  c.total_bytes += text.size();
  std::istringstream lines(text);
  std::string line, rec;
  auto flush = [&] {
    std::string& part = record % 10 == 8 ? c.validation : record % 10 == 9 ? c.test : c.train;
    part += rec;
    rec.clear();
    ++record;
  };
  while (std::getline(lines, line)) {
    if (line == "%") flush();
    else rec += line + "\n";
  }
  if (!rec.empty()) flush();
}

inline std::string read_file(std::string const& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace detail

/// Reads the files fortunes, literature and riddles of `dir` (in that order) and splits them
/// by record (detail::split_records). Throws std::runtime_error naming the missing file and the fix.
inline corpus load_corpus(std::string const& dir = default_corpus_dir()) {
  corpus c;
  c.source = dir + "/{fortunes,literature,riddles}";
  std::size_t record = 0;
  for (char const* name : {"fortunes", "literature", "riddles"}) {
    if (!std::ifstream(dir + "/" + name, std::ios::binary))
      throw std::runtime_error("lab::load_corpus: cannot read " + dir + "/" + name +
                               "; install the corpus with scripts/deps.sh (Debian package fortunes-min)");
    detail::split_records(c, detail::read_file(dir + "/" + name), record);
  }
  return c;
}

/// The study's corpus must hold at least this many bytes.
inline constexpr std::size_t study_corpus_minimum = 1500000;

/// Every fortune file of `dir` (Debian packages fortunes-min and fortunes: the regular files
/// without an extension, in name order), split by record. Throws std::runtime_error when they
/// hold fewer than study_corpus_minimum bytes, naming the count and the command that installs
/// the full set.
inline corpus load_study_corpus(std::string const& dir = default_corpus_dir()) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto const& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.is_symlink() && !e.path().has_extension()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  corpus c;
  c.source = dir + " (" + std::to_string(names.size()) + " files)";
  std::size_t record = 0;
  for (auto const& n : names) detail::split_records(c, detail::read_file(dir + "/" + n), record);
  if (c.total_bytes < study_corpus_minimum)
    throw std::runtime_error("lab::load_study_corpus: " + dir + " holds " + std::to_string(c.total_bytes) +
                             " bytes of fortunes, expected at least " + std::to_string(study_corpus_minimum) +
                             "; install the full set with: sudo apt-get install fortunes");
  return c;
}

/// A training batch: `batch` windows of seq + 1 bytes at seeded random offsets of `text`.
inline batch_tokens sample_batch(std::string const& text, int batch, int seq, normal_source& rng) {
  batch_tokens b;
  b.batch = batch;
  b.seq = seq;
  auto span = static_cast<std::uint64_t>(text.size() - static_cast<std::size_t>(seq) - 1);
  for (int i = 0; i < batch; ++i) {
    auto o = static_cast<std::size_t>(rng.below(span));
    for (int s = 0; s < seq; ++s) {
      b.inputs.push_back(static_cast<unsigned char>(text[o + static_cast<std::size_t>(s)]));
      b.targets.push_back(static_cast<unsigned char>(text[o + static_cast<std::size_t>(s) + 1]));
    }
  }
  return b;
}

/// The consecutive non-overlapping windows of `seq` bytes of `text`, at most `batch` per batch.
inline std::vector<batch_tokens> eval_batches(std::string const& text, int batch, int seq) {
  std::vector<batch_tokens> out;
  std::size_t const n = (text.size() - 1) / static_cast<std::size_t>(seq);
  for (std::size_t w = 0; w < n; w += static_cast<std::size_t>(batch)) {
    batch_tokens b;
    b.seq = seq;
    b.batch = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(batch), n - w));
    for (std::size_t i = w; i < w + static_cast<std::size_t>(b.batch); ++i)
      for (std::size_t s = 0; s < static_cast<std::size_t>(seq); ++s) {
        b.inputs.push_back(static_cast<unsigned char>(text[i * static_cast<std::size_t>(seq) + s]));
        b.targets.push_back(static_cast<unsigned char>(text[i * static_cast<std::size_t>(seq) + s + 1]));
      }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace lab
