// SPDX-License-Identifier: MIT
// The experiments of the lab: comparison table, controls, pictures, the study's plan (see docs/experiments.md).
#include "experiments.hpp"

#include "bench.hpp"
#include "checkpoint.hpp"
#include "modes.hpp"
#include "plots.hpp"
#include "report.hpp"
#include "seeds.hpp"
#include "study.hpp"
#include "train.hpp"

#include <support/png.hpp>

#include <Eigen/Core>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lab {
namespace {

/// Model size and steps (modes.hpp: quick runs in ctest), with the options' threads and setup.
config sized(experiment_options const& o) {
  config c = mode_config(o.quick);
  c.threads = o.threads;
  c.embedding = o.embedding;
  return c;
}
int train_steps(experiment_options const& o) { return mode_steps(o.quick); }
int seed_count(experiment_options const& o) { return o.seeds > 0 ? o.seeds : default_seeds; }

/// "sqrt_d (tokens x sqrt(d_model))": the setup as the tables' headings name it.
std::string setup_label(embedding_setup e) {
  switch (e) {
    case embedding_setup::sqrt_d: return "sqrt_d (tokens x sqrt(d_model), the original Transformer)";
    case embedding_setup::unscaled: return "unscaled (tokens and tables N(0, 0.02), added as they are)";
    case embedding_setup::bert: return "bert (tokens and tables N(0, 0.02) truncated at 2 sd, added as they are)";
    case embedding_setup::matched: return "matched (fixed position signals scaled to the token embeddings' norm)";
  }
  return "?";
}

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

/// The checkpoint of encoding `name`, seed k, in the output folder.
std::string checkpoint_path(experiment_options const& o, std::string const& name, int k) {
  return o.out + "/" + file_name(name) + ".seed" + std::to_string(k) + ".ckpt";
}

corpus open_corpus(experiment_options const& o) {
  corpus c = load_corpus(o.corpus_dir.empty() ? default_corpus_dir() : o.corpus_dir);
  std::printf("corpus: %s, %zu bytes (train %zu, validation %zu, test %zu)\n", c.source.c_str(), c.total_bytes,
              c.train.size(), c.validation.size(), c.test.size());
  return c;
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

/// A trained model (seed 1): from compare's checkpoint when it holds this configuration, else trained.
std::unique_ptr<model<float>> trained(experiment_options const& o, corpus const& cp, std::string const& name) {
  config c = with_seed(with_encoding(sized(o), name), 1);
  std::string path = checkpoint_path(o, name, 1);
  if (std::filesystem::exists(path)) {
    auto l = load_checkpoint<float>(path);
    config const& k = l.net.cfg();
    if (k.d_model == c.d_model && k.seq == c.seq && k.layers == c.layers && k.lower == c.lower && k.upper == c.upper &&
        k.embedding == c.embedding) {
      std::printf("%s: loaded %s\n", name.c_str(), path.c_str());
      return std::make_unique<model<float>>(std::move(l.net));
    }
  }
  auto m = std::make_unique<model<float>>(c);
  train(*m, cp.train, train_steps(o));
  save_checkpoint(path, *m, static_cast<std::uint64_t>(train_steps(o)));
  return m;
}

void write_plot(std::string const& path, png::image const& img) {
  png::write_png(path, img);
  std::printf("wrote %s\n", path.c_str());
}

/// The panels side by side in one picture.
png::image panels(std::vector<png::image> const& p) { return png::side_by_side(p, static_cast<int>(p.size())); }

}  // namespace

// ---- (a) comparison ---------------------------------------------------------------------------
namespace {
/// One row of the comparison over the seeds: each seed's perplexity at 1x, 2x, 4x, 8x.
struct compare_row {
  std::string name;
  std::vector<std::vector<double>> ppl;  // [length][seed]
  std::vector<double> steps_per_second, peak;
  std::size_t params = 0;
  spread at(std::size_t i) const { return spread_of(ppl[i]); }
  void add(std::vector<double> const& p) {
    ppl.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) ppl[i].push_back(p[i]);
  }
};

/// The rows of one encoding: trained once per seed, evaluated plain and with each extension rule.
std::vector<compare_row> compare_encoding(experiment_options const& o, corpus const& cp, std::string const& name, progress& p) {
  config c = with_encoding(sized(o), name);
  bool has_rope = c.lower.attention == attention_kind::rope || c.lower.attention == attention_kind::rope_alibi;
  bool has_learned = c.lower.absolute == absolute_kind::learned;
  std::vector<std::pair<rope_eval, char const*>> rules;
  if (has_rope) rules = {{rope_eval::linear, " (linear)"}, {rope_eval::dynamic_ntk, " (dynamic NTK)"}, {rope_eval::yarn, " (YaRN)"}};
  std::vector<compare_row> rows(1 + rules.size() + (has_learned ? 1 : 0));
  rows[0].name = name;
  for (std::size_t i = 0; i < rules.size(); ++i) rows[1 + i].name = name + rules[i].second;
  if (has_learned) rows.back().name = name + " (extended)";
  for (int k = 1; k <= seed_count(o); ++k) {
    bool const ok_peak = reset_peak_memory();
    model<float> m(with_seed(c, k));
    train_result r = train(m, cp.train, train_steps(o));
    rows[0].peak.push_back(ok_peak ? peak_memory_mib() : std::nan(""));
    rows[0].steps_per_second.push_back(r.steps_per_second());
    rows[0].params = m.params().size();
    save_checkpoint(checkpoint_path(o, name, k), m, static_cast<std::uint64_t>(train_steps(o)));
    rows[0].add(perplexities(m, cp.validation, rope_eval::plain, false));
    for (std::size_t i = 0; i < rules.size(); ++i) rows[1 + i].add(perplexities(m, cp.validation, rules[i].first, false));
    if (has_learned) rows.back().add(perplexities(m, cp.validation, rope_eval::plain, true));
    p.done(name + " seed " + std::to_string(k), "ppl@1x " + fmt("%.2f", rows[0].ppl[0].back()));
  }
  std::printf("%-14s ppl@1x %s, %.1f steps/s\n", name.c_str(), rows[0].at(0).str().c_str(), spread_of(rows[0].steps_per_second).mean);
  return rows;
}

std::vector<std::string> compare_encodings(experiment_options const& o) {
  if (!o.encodings.empty()) return o.encodings;
  return {"none", "sinusoidal", "learned", "rope", "alibi", "t5", "clipped", "shaw", "rope+alibi", "learned+t5", "rope/none"};
}
}  // namespace

void run_compare(experiment_options const& o) {
  std::filesystem::create_directories(o.out);
  corpus cp = open_corpus(o);
  config base = sized(o);
  auto const names = compare_encodings(o);
  for (auto const& n : names) with_encoding(base, n);  // bad names fail before any training
  int const seeds = seed_count(o);
  progress p(o.log, static_cast<int>(names.size()) * seeds);
  md_table t({"encoding (embedding " + embedding_setup_name(o.embedding) + ")", "ppl @" + std::to_string(base.seq), "bits/byte",
              "ppl @" + std::to_string(2 * base.seq), "ppl @" + std::to_string(4 * base.seq), "ppl @" + std::to_string(8 * base.seq),
              "steps/s", "peak MiB", "parameters"});
  std::map<std::string, seed_curve> curves;  // by row name
  std::vector<double> lengths;
  for (int i = 0; i < 4; ++i) lengths.push_back(base.seq << i);
  for (std::string const& name : names) {
    for (auto const& row : compare_encoding(o, cp, name, p)) {
      bool trained_row = row.params > 0;
      std::vector<double> bits;
      for (double v : row.ppl[0]) bits.push_back(std::log2(v));
      t.add({row.name, row.at(0).str(), spread_of(bits).str("%.3f"), row.at(1).str(), row.at(2).str(), row.at(3).str(),
             trained_row ? num(spread_of(row.steps_per_second).mean, "%.1f") : "",
             trained_row ? num(spread_of(row.peak).max, "%.1f") : "", trained_row ? std::to_string(row.params) : ""});
      std::vector<spread> y;
      for (std::size_t i = 0; i < 4; ++i) y.push_back(row.at(i));
      curves[row.name] = seed_curve_of(row.name, lengths, y);
    }
  }
  std::string md = "Validation perplexity (bytes) by evaluation length; trained at " + std::to_string(base.seq) + " bytes for " +
                   std::to_string(train_steps(o)) + " steps (" + (o.quick ? "quick" : "full") + " mode), embedding setup " +
                   setup_label(o.embedding) + ". Each cell: mean of " + std::to_string(seeds) +
                   " seeds (min..max); steps/s their mean, peak MiB their largest.\n\n" + t.str();
  write_text(o.out + "/compare.md", md);
  std::printf("\n%s", md.c_str());
  // Two panels: the main encodings (a learned table stretched past its rows) and RoPE's scalings.
  auto panel = [&](std::vector<std::string> const& rows, std::string const& title) {
    std::vector<seed_curve> cs;
    for (auto const& r : rows)
      if (curves.count(r)) cs.push_back(curves[r]);
    return line_plot(cs, {title, "X: EVALUATION LENGTH (LOG)  Y: PERPLEXITY; BANDS: MIN..MAX OF " + std::to_string(seeds) + " SEEDS",
                          true, powers_of_two(lengths.front(), lengths.back()), {static_cast<double>(base.seq)}});
  };
  write_plot(o.out + "/compare_ppl.png",
             panels({panel({"none", "sinusoidal", "learned (extended)", "rope", "alibi", "t5", "shaw", "rope+alibi"},
                           "VALIDATION PERPLEXITY BY LENGTH (TRAINED AT " + std::to_string(base.seq) + ")"),
                     panel({"rope", "rope (linear)", "rope (dynamic NTK)", "rope (YaRN)"}, "ROPE PAST THE TRAINING LENGTH")}));
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
  int const large = train_steps(o), small = large / 6, seeds = seed_count(o);
  // Every control in the canonical and the unscaled setups, then the two scalings met in practice.
  std::vector<std::pair<std::string, embedding_setup>> runs;
  for (auto setup : {embedding_setup::sqrt_d, embedding_setup::unscaled})
    for (std::string name : {"sinusoidal", "learned", "integer", "zero", "noise"}) runs.push_back({name, setup});
  runs.push_back({"learned", embedding_setup::bert});
  runs.push_back({"sinusoidal", embedding_setup::matched});
  progress p(o.log, static_cast<int>(runs.size()) * seeds);
  md_table t({"encoding", "embedding", "train loss @" + std::to_string(small), "val loss @" + std::to_string(small),
              "train loss @" + std::to_string(large), "val loss @" + std::to_string(large)});
  std::vector<seed_curve> scaled, unscaled;  // the canonical setup; the others
  for (auto const& [name, setup] : runs) {
    config c = with_encoding(sized(o), name);
    c.embedding = setup;
    std::vector<double> train_small, val_small, train_large, val_large;
    std::vector<std::vector<double>> curve(static_cast<std::size_t>(large - 9));  // [s - 10][seed]: mean10(s)
    for (int k = 1; k <= seeds; ++k) {
      model<float> m(with_seed(c, k));
      std::vector<double> val;
      train_result r = train(m, cp.train, large, [&](int s) {
        if (s == small || s == large) val.push_back(evaluate(m, cp.validation, eval_mode{}));
      });
      auto mean10 = [&](int s) {  // mean training loss of the 10 steps ending at step s
        double sum = 0;
        for (int i = s - 10; i < s; ++i) sum += r.losses[static_cast<std::size_t>(i)];
        return sum / 10;
      };
      train_small.push_back(mean10(small));
      val_small.push_back(val[0]);
      train_large.push_back(mean10(large));
      val_large.push_back(val[1]);
      for (int s = 10; s <= large; ++s) curve[static_cast<std::size_t>(s - 10)].push_back(mean10(s));
      p.done(name + " (" + embedding_setup_name(setup) + ") seed " + std::to_string(k), "val loss " + fmt("%.3f", val[1]));
    }
    t.add({name, embedding_setup_name(setup), spread_of(train_small).str("%.3f"), spread_of(val_small).str("%.3f"),
           spread_of(train_large).str("%.3f"), spread_of(val_large).str("%.3f")});
    std::vector<double> steps;
    std::vector<spread> y;
    for (int s = 10; s <= large; ++s) {
      steps.push_back(s);
      y.push_back(spread_of(curve[static_cast<std::size_t>(s - 10)]));
    }
    auto& panel = setup == embedding_setup::sqrt_d ? scaled : unscaled;
    panel.push_back(seed_curve_of(name + (setup == embedding_setup::sqrt_d ? "" : " " + embedding_setup_name(setup)), steps, y));
    std::printf("%-10s %-8s val loss %s after %d steps, %s after %d\n", name.c_str(), embedding_setup_name(setup).c_str(),
                spread_of(val_small).str("%.3f").c_str(), small, spread_of(val_large).str("%.3f").c_str(), large);
  }
  std::string md = "Losses in nats per byte (training: mean of the 10 steps ending there; validation: at the training length); "
                   "each cell the mean of " + std::to_string(seeds) + " seeds (min..max). Embedding setups: " +
                   setup_label(embedding_setup::sqrt_d) + "; " + setup_label(embedding_setup::unscaled) + "; " +
                   setup_label(embedding_setup::bert) + "; " + setup_label(embedding_setup::matched) + ".\n\n" + t.str();
  write_text(o.out + "/controls.md", md);
  std::printf("\n%s", md.c_str());
  std::string const axes = "X: STEP  Y: NATS PER BYTE (MEAN OF 10 STEPS); BANDS: MIN..MAX OF " + std::to_string(seeds) + " SEEDS";
  write_plot(o.out + "/controls_loss.png", panels({line_plot(scaled, {"CONTROLS, TOKENS X SQRT(D_MODEL)", axes, false, {}, {}}),
                                                   line_plot(unscaled, {"CONTROLS, UNSCALED, BERT AND MATCHED", axes, false, {}, {}})}));
}

// ---- the study's plan ---------------------------------------------------------------------------
void run_study_plan(experiment_options const& o, int steps, double budget_minutes) {
  corpus cp = load_study_corpus(o.corpus_dir.empty() ? default_corpus_dir() : o.corpus_dir);
  std::printf("corpus: %s, %zu bytes (train %zu, validation %zu, test %zu)\n", cp.source.c_str(), cp.total_bytes,
              cp.train.size(), cp.validation.size(), cp.test.size());
  config c = with_encoding(study_config(), "rope");
  c.threads = o.threads;
  double const rate = bench_training(c, cp.train, 2, 10).steps_per_second();
  // Evaluation: one batch timed at each length, times the batches the validation split makes there.
  model<float> m(c);
  double eval_seconds = 0;
  for (double f : study_length_factors()) {
    auto batches = eval_batches(cp.validation, c.batch, static_cast<int>(f * c.seq));
    auto t0 = std::chrono::steady_clock::now();
    m.loss(batches.front(), eval_mode{static_cast<int>(f * c.seq), rope_eval::plain, false});
    eval_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * static_cast<double>(batches.size());
  }
  double const memory = available_memory_mib();
  study_plan p = plan_study(rate, eval_seconds, cp.train.size(), steps, budget_minutes, std::isnan(memory) ? 0.0 : memory);
  std::printf("%s", describe(p).c_str());
  check_study_plan(p);
  std::printf("the plan fits its budgets\n");
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
    s.title = drawable(name + " HEAD " + std::to_string(h));
    s.axes = drawable("ROWS: QUERY  COLS: KEY");
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
  md_table dist({"encoding (embedding " + embedding_setup_name(o.embedding) + ", seed 1)", "mean attended distance per head (last layer, bytes)"});
  std::vector<seed_curve> by_position, by_length;
  int const smooth_half = 4;  // loss by position: the mean over 9 positions
  std::vector<std::string> const names = {"none", "sinusoidal", "learned", "rope", "alibi", "t5"};
  progress p(o.log, static_cast<int>(names.size()));
  for (std::string const& name : names) {
    auto m = trained(o, cp, name);
    eval_mode far{8 * base.seq, rope_eval::plain, true};
    seed_curve pos{name, {}, {}, {}, {}}, len{name, {}, {}, {}, {}};
    evaluate(*m, cp.validation, far, &pos.y);
    pos.y = smoothed(pos.y, smooth_half);
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
    p.done(name, "ppl@1x " + fmt("%.2f", len.y[1]));
  }
  std::string md = "Mean attended distance sum_j p_ij (i - j), first validation batch, last layer.\n\n" + dist.str() +
                   "\nPictures: position_loss.png, ppl_vs_length.png, attention_<encoding>.png.\n";
  write_text(o.out + "/pictures.md", md);
  std::printf("\n%s", md.c_str());
  write_plot(o.out + "/position_loss.png",
             line_plot(by_position, {"VALIDATION LOSS BY POSITION, SEED 1 (TRAINED AT " + std::to_string(base.seq) + ", LEARNED EXTENDED)",
                                     "X: POSITION (DASHED: TRAINING LENGTH)  Y: NATS, MEAN OF ALL WINDOWS AND OF " +
                                         std::to_string(2 * smooth_half + 1) + " POSITIONS",
                                     false, {}, {static_cast<double>(base.seq)}}));
  write_plot(o.out + "/ppl_vs_length.png",
             line_plot(by_length, {"VALIDATION PERPLEXITY BY EVALUATION LENGTH, SEED 1", "X: LENGTH (LOG)  Y: PERPLEXITY", true,
                                   powers_of_two(base.seq / 2, 8 * base.seq), {static_cast<double>(base.seq)}}));
}

}  // namespace lab
