// SPDX-License-Identifier: MIT
// The three experiments of the lab: comparison table, controls, pictures (see docs/experiments.md).
#include "experiments.hpp"

#include "bench.hpp"
#include "checkpoint.hpp"
#include "report.hpp"
#include "train.hpp"

#include <support/png.hpp>

#include <Eigen/Core>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace lab {
namespace {

namespace png = posenc_examples;

/// Model size and steps: quick runs in ctest, full is the documented study.
config sized(experiment_options const& o) {
  config c;
  c.layers = 2;
  c.d_model = o.quick ? 32 : 64;
  c.heads = o.quick ? 2 : 4;
  c.seq = o.quick ? 32 : 64;
  c.batch = o.quick ? 4 : 8;
  c.split = c.layers;
  c.threads = o.threads;
  return c;
}
int train_steps(experiment_options const& o) { return o.quick ? 40 : 600; }

/// A config for "name" or "lower/upper" (lower half of the layers, upper half).
config with_encoding(config c, std::string const& name) {
  auto bar = name.find('/');
  if (bar == std::string::npos) {
    c.lower = c.upper = parse_encoding(name);
    c.split = c.layers;
  } else {
    c.lower = parse_encoding(name.substr(0, bar));
    c.upper = parse_encoding(name.substr(bar + 1));
    c.split = c.layers / 2;
  }
  return c;
}

std::string file_name(std::string name) {
  for (auto& ch : name)
    if (ch == '/' || ch == '+') ch = '_';
  return name;
}

corpus open_corpus(experiment_options const& o) {
  corpus c = load_corpus(o.corpus_dir.empty() ? default_corpus_dir() : o.corpus_dir);
  std::printf("corpus: %s, %zu bytes (train %zu, validation %zu, test %zu)\n", c.source.c_str(), c.total_bytes,
              c.train.size(), c.validation.size(), c.test.size());
  return c;
}

png::rgb color(std::size_t i) {
  static std::uint32_t const p[] = {0x1F77B4, 0xFF7F0E, 0x2CA02C, 0xD62728, 0x9467BD, 0x8C564B,
                                    0xE377C2, 0x7F7F7F, 0xBCBD22, 0x17BECF, 0x000000, 0xAEC7E8};
  return png::hex(p[i % 12]);
}

/// exp(loss) at the given evaluation mode, NaN when the encoding cannot run there.
double perplexity(model<float>& m, std::string const& text, eval_mode const& e) {
  try {
    return std::exp(evaluate(m, text, e));
  } catch (not_applicable const&) {
    return std::nan("");
  }
}

/// One row of the comparison: perplexity at 1x, 2x, 4x, 8x.
std::vector<double> perplexities(model<float>& m, std::string const& text, rope_eval r, bool extend) {
  std::vector<double> out;
  for (int f : {1, 2, 4, 8}) out.push_back(perplexity(m, text, eval_mode{f * m.cfg().seq, r, extend}));
  return out;
}

/// A trained model: from out/<name>.ckpt when it holds this configuration, else trained.
std::unique_ptr<model<float>> trained(experiment_options const& o, corpus const& cp, std::string const& name) {
  config c = with_encoding(sized(o), name);
  std::string path = o.out + "/" + file_name(name) + ".ckpt";
  if (std::filesystem::exists(path)) {
    auto l = load_checkpoint<float>(path);
    config const& k = l.net.cfg();
    if (k.d_model == c.d_model && k.seq == c.seq && k.layers == c.layers && k.lower == c.lower && k.upper == c.upper) {
      std::printf("%s: loaded %s\n", name.c_str(), path.c_str());
      return std::make_unique<model<float>>(std::move(l.net));
    }
  }
  auto m = std::make_unique<model<float>>(c);
  train(*m, cp.train, train_steps(o));
  save_checkpoint(path, *m, static_cast<std::uint64_t>(train_steps(o)));
  return m;
}

void write_plot(std::string const& path, std::vector<png::curve> const& curves, png::plot_style const& s) {
  png::write_png(path, png::render_curves(curves, s));
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace

// ---- (a) comparison ---------------------------------------------------------------------------
namespace {
struct compare_row {
  std::string name;
  std::vector<double> ppl;
  double steps_per_second = std::nan(""), peak = std::nan("");
  std::size_t params = 0;
};

/// The rows of one encoding: trained once, evaluated plain and with each extension rule.
std::vector<compare_row> compare_encoding(experiment_options const& o, corpus const& cp, std::string const& name) {
  config c = with_encoding(sized(o), name);
  bool const ok_peak = reset_peak_memory();
  model<float> m(c);
  train_result r = train(m, cp.train, train_steps(o));
  double peak = ok_peak ? peak_memory_mib() : std::nan("");
  save_checkpoint(o.out + "/" + file_name(name) + ".ckpt", m, static_cast<std::uint64_t>(train_steps(o)));
  std::vector<compare_row> rows{{name, perplexities(m, cp.validation, rope_eval::plain, false), r.steps_per_second(), peak, m.params().size()}};
  bool has_rope = c.lower.attention == attention_kind::rope || c.lower.attention == attention_kind::rope_alibi;
  bool has_learned = c.lower.absolute == absolute_kind::learned;
  if (has_rope)
    for (auto [rule, label] : {std::pair{rope_eval::linear, " (linear)"}, {rope_eval::dynamic_ntk, " (dynamic NTK)"}, {rope_eval::yarn, " (YaRN)"}})
      rows.push_back({name + label, perplexities(m, cp.validation, rule, false)});
  if (has_learned) rows.push_back({name + " (extended)", perplexities(m, cp.validation, rope_eval::plain, true)});
  std::printf("%-14s train loss %.3f, %.1f steps/s, ppl@1x %.2f\n", name.c_str(), r.losses.back(), r.steps_per_second(), rows[0].ppl[0]);
  return rows;
}
}  // namespace

void run_compare(experiment_options const& o) {
  std::filesystem::create_directories(o.out);
  corpus cp = open_corpus(o);
  config base = sized(o);
  md_table t({"encoding", "ppl @" + std::to_string(base.seq), "bits/byte", "ppl @" + std::to_string(2 * base.seq),
              "ppl @" + std::to_string(4 * base.seq), "ppl @" + std::to_string(8 * base.seq), "steps/s", "peak MiB", "parameters"});
  std::vector<png::curve> curves;
  for (std::string name : {"none", "sinusoidal", "learned", "rope", "alibi", "t5", "clipped", "shaw", "rope+alibi", "learned+t5", "rope/none"}) {
    for (auto const& row : compare_encoding(o, cp, name)) {
      bool trained_row = row.params > 0;
      t.add({row.name, num(row.ppl[0]), num(std::log2(row.ppl[0]), "%.3f"), num(row.ppl[1]), num(row.ppl[2]), num(row.ppl[3]),
             trained_row ? num(row.steps_per_second, "%.1f") : "", trained_row ? num(row.peak, "%.1f") : "",
             trained_row ? std::to_string(row.params) : ""});
      png::curve cv{row.name, {}, {}, color(curves.size())};
      for (int i = 0; i < 4; ++i) {
        cv.x.push_back(base.seq << i);
        cv.y.push_back(row.ppl[static_cast<std::size_t>(i)]);
      }
      curves.push_back(cv);
    }
  }
  std::string md = "Validation perplexity (bytes) by evaluation length; trained at " + std::to_string(base.seq) + " bytes for " +
                   std::to_string(train_steps(o)) + " steps (" + (o.quick ? "quick" : "full") + " mode).\n\n" + t.str();
  write_text(o.out + "/compare.md", md);
  std::printf("\n%s", md.c_str());
  write_plot(o.out + "/compare_ppl.png", curves, {"VALIDATION PERPLEXITY BY EVALUATION LENGTH", "X: LENGTH (LOG)  Y: PERPLEXITY", 520, 300, true});
}

// ---- training throughput -----------------------------------------------------------------------
void run_bench(experiment_options const& o, std::string const& encoding, int warmup, int steps) {
  config c = with_encoding(sized(o), encoding);
  std::printf("lab-config %s\n", config_json(c).c_str());
  std::fflush(stdout);
  if (steps <= 0) return;
  corpus cp = load_corpus(o.corpus_dir.empty() ? default_corpus_dir() : o.corpus_dir);
  std::printf("lab-bench %s\n", bench_json(bench_training(c, cp.train, warmup, steps)).c_str());
}

// ---- (b) controls -----------------------------------------------------------------------------
void run_controls(experiment_options const& o) {
  std::filesystem::create_directories(o.out);
  corpus cp = open_corpus(o);
  int const small = o.quick ? 20 : 100, large = o.quick ? 60 : 600;
  md_table t({"encoding", "train loss @" + std::to_string(small), "val loss @" + std::to_string(small),
              "train loss @" + std::to_string(large), "val loss @" + std::to_string(large)});
  std::vector<png::curve> curves;
  for (std::string name : {"sinusoidal", "learned", "integer", "zero", "noise"}) {
    model<float> m(with_encoding(sized(o), name));
    std::vector<double> val;
    train_result r = train(m, cp.train, large, [&](int s) {
      if (s == small || s == large) val.push_back(evaluate(m, cp.validation, eval_mode{}));
    });
    auto mean10 = [&](int s) {  // mean training loss of the 10 steps ending at step s
      double sum = 0;
      for (int i = s - 10; i < s; ++i) sum += r.losses[static_cast<std::size_t>(i)];
      return sum / 10;
    };
    t.add({name, num(mean10(small), "%.3f"), num(val[0], "%.3f"), num(mean10(large), "%.3f"), num(val[1], "%.3f")});
    png::curve cv{name, {}, {}, color(curves.size())};
    for (int s = 10; s <= large; ++s) {
      cv.x.push_back(s);
      cv.y.push_back(mean10(s));
    }
    curves.push_back(cv);
    std::printf("%-10s val loss %.3f after %d steps, %.3f after %d\n", name.c_str(), val[0], small, val[1], large);
  }
  std::string md = "Losses in nats per byte (training: mean of the 10 steps ending there; validation: at the training length).\n\n" + t.str();
  write_text(o.out + "/controls.md", md);
  std::printf("\n%s", md.c_str());
  write_plot(o.out + "/controls_loss.png", curves, {"TRAINING LOSS (MEAN OF 10 STEPS)", "X: STEP  Y: NATS PER BYTE", 520, 300, false});
}

// ---- (c) pictures -----------------------------------------------------------------------------
namespace {
/// Mean attended distance sum_j p_ij (i - j) per head, averaged over queries and windows.
std::vector<double> attended_distance(std::vector<float> const& p, int batch, int heads, int seq) {
  std::vector<double> d(static_cast<std::size_t>(heads), 0.0);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < seq; ++i)
        for (int j = 0; j <= i; ++j)
          d[static_cast<std::size_t>(h)] += p[static_cast<std::size_t>(((b * heads + h) * seq + i) * seq + j)] * static_cast<double>(i - j);
  for (auto& v : d) v /= static_cast<double>(batch) * seq;
  return d;
}

/// The attention maps of the last layer, one heatmap per head, for the first validation window.
png::image attention_maps(model<float>& m, std::string const& text, std::string const& name, std::vector<double>& distance) {
  auto windows = eval_batches(text, m.cfg().batch, m.cfg().seq);
  auto const& b = windows.front();
  int const H = m.cfg().heads, S = m.cfg().seq;
  auto p = m.attention_map(b, m.cfg().layers - 1);
  distance = attended_distance(p, b.batch, H, S);
  std::vector<png::image> maps;
  for (int h = 0; h < H; ++h) {
    png::heatmap_style s;
    s.title = name + " HEAD " + std::to_string(h);
    s.axes = "ROWS: QUERY  COLS: KEY";
    s.cell_w = s.cell_h = S <= 32 ? 4 : 2;
    maps.push_back(png::render_heatmap(p.data() + static_cast<std::size_t>(h) * S * S, S, S, s));
  }
  return png::side_by_side(maps, H);
}
}  // namespace

void run_pictures(experiment_options const& o) {
  std::filesystem::create_directories(o.out);
  corpus cp = open_corpus(o);
  config base = sized(o);
  md_table dist({"encoding", "mean attended distance per head (last layer, bytes)"});
  std::vector<png::curve> by_position, by_length;
  for (std::string name : {"none", "sinusoidal", "learned", "rope", "alibi", "t5"}) {
    auto m = trained(o, cp, name);
    eval_mode far{8 * base.seq, rope_eval::plain, true};
    png::curve pos{name, {}, {}, color(by_position.size())}, len{name, {}, {}, color(by_length.size())};
    evaluate(*m, cp.validation, far, &pos.y);
    for (std::size_t i = 0; i < pos.y.size(); ++i) pos.x.push_back(static_cast<double>(i));
    for (int f : {1, 2, 4, 8, 16}) {
      len.x.push_back(base.seq * f / 2);
      len.y.push_back(perplexity(*m, cp.validation, eval_mode{base.seq * f / 2, rope_eval::plain, false}));
    }
    by_position.push_back(pos);
    by_length.push_back(len);
    std::vector<double> d;
    png::write_png(o.out + "/attention_" + file_name(name) + ".png", attention_maps(*m, cp.validation, name, d));
    std::string cell;
    for (double v : d) cell += fmt("%.1f ", v);
    dist.add({name, cell});
  }
  std::string md = "Mean attended distance sum_j p_ij (i - j), first validation batch, last layer.\n\n" + dist.str() +
                   "\nPictures: position_loss.png, ppl_vs_length.png, attention_<encoding>.png.\n";
  write_text(o.out + "/pictures.md", md);
  std::printf("\n%s", md.c_str());
  write_plot(o.out + "/position_loss.png", by_position,
             {"VALIDATION LOSS BY POSITION (TRAINED AT " + std::to_string(base.seq) + "; LEARNED EXTENDED)", "X: POSITION  Y: NATS", 560, 300, false});
  write_plot(o.out + "/ppl_vs_length.png", by_length, {"VALIDATION PERPLEXITY VS EVALUATION LENGTH", "X: LENGTH (LOG)  Y: PERPLEXITY", 520, 300, true});
}

}  // namespace lab
