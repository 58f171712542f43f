// SPDX-License-Identifier: MIT
// The posenc tour: every encoder on one toy sequence, measured, printed, and drawn as PNG pictures.
//
//   posenc_example_tour [--out DIR]      (default DIR: tour-out)
//
// A seeded toy sequence (12 tokens, width 32, 4 heads of 8) runs through
// bidirectional self-attention with each encoder. For each, a table row says
// where the encoder acts (from its encoder_traits), how many parameters it
// has, and what the attention does: the measured permutation-equivariance
// and shift-invariance errors, the mean attention entropy and the mean
// attended distance. The pictures go to DIR (docs/img holds the same ones).
#include <posenc/posenc.hpp>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/png.hpp"

namespace {

using posenc::index_t;
namespace px = posenc_examples;

// ---------------------------------------------------------------------------
// The toy model: token embeddings and Q/K/V projection weights, all seeded.

constexpr index_t seq = 12, d_model = 32, heads = 4, head_dim = d_model / heads;
constexpr index_t shift = 100;  // every position + 100 for the shift-invariance check

struct toy_model {
  std::vector<float> x;           // (seq, d_model) token embeddings, N(0, 1)
  std::vector<float> wq, wk, wv;  // (d_model, d_model), N(0, 1/d_model): q, k, v entries ~ N(0, 1)
  std::vector<index_t> perm;      // a fixed permutation of the tokens

  explicit toy_model(std::uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> n01(0.0, 1.0);
    auto draw = [&](std::vector<float>& v, std::size_t n, double scale) {
      v.resize(n);
      for (auto& e : v) e = static_cast<float>(n01(gen) * scale);
    };
    draw(x, seq * d_model, 1.0);
    double const w = 1.0 / std::sqrt(static_cast<double>(d_model));
    draw(wq, d_model * d_model, w);
    draw(wk, d_model * d_model, w);
    draw(wv, d_model * d_model, w);
    perm.resize(seq);
    std::iota(perm.begin(), perm.end(), index_t{0});
    for (index_t i = seq - 1; i > 0; --i) std::swap(perm[i], perm[static_cast<index_t>(gen() % (i + 1))]);
  }
};

/// y (seq, d_model) = x (seq, d_model) * w (d_model, d_model); viewed as (1, seq, heads, head_dim).
std::vector<float> project(std::vector<float> const& x, std::vector<float> const& w) {
  std::vector<float> y(seq * d_model, 0.0f);
  for (index_t s = 0; s < seq; ++s)
    for (index_t i = 0; i < d_model; ++i)
      for (index_t o = 0; o < d_model; ++o) y[s * d_model + o] += x[s * d_model + i] * w[i * d_model + o];
  return y;
}

struct attention_result {
  std::vector<float> out;    // (seq, heads, head_dim)
  std::vector<float> probs;  // (heads, seq, seq)
};

/// Self-attention of the toy sequence with `enc`, tokens at positions first .. first + seq - 1.
/// Additive encoders add to the embeddings first (their add_to); every other
/// encoder goes to posenc::attention, which acts where its traits say.
template <class E>
attention_result run(E const& enc, toy_model const& m, std::vector<float> x, index_t first) {
  auto positions = posenc::position_span(first);
  if constexpr (posenc::adds_to_embeddings_v<E>) enc.add_to(posenc::make_bsd(x.data(), 1, seq, d_model), positions);
  std::vector<float> q = project(x, m.wq), k = project(x, m.wk), v = project(x, m.wv);
  attention_result r{std::vector<float>(seq * d_model), std::vector<float>(heads * seq * seq)};
  posenc::attention_options<float> opt;  // bidirectional: no causal mask
  opt.q_positions = positions;
  opt.k_positions = positions;
  opt.scores = r.probs;
  opt.scores_stage = posenc::score_stage::probabilities;
  auto qv = posenc::make_bshd(q.data(), 1, seq, heads, head_dim);
  auto kv = posenc::make_bshd(k.data(), 1, seq, heads, head_dim);
  auto vv = posenc::make_bshd(v.data(), 1, seq, heads, head_dim);
  auto ov = posenc::make_bshd(r.out.data(), 1, seq, heads, head_dim);
  if constexpr (posenc::adds_to_embeddings_v<E>) {
    posenc::attention<posenc::path::materialized>(qv, kv, vv, ov, posenc::none{}, opt);
  } else {
    posenc::attention<posenc::path::materialized>(qv, kv, vv, ov, enc, opt);
  }
  return r;
}

// ---------------------------------------------------------------------------
// What the table says about an encoder.

template <class E>
std::string where_it_acts() {
  using tr = posenc::encoder_traits<E>;
  std::string s;
  auto add = [&](bool on, char const* what) {
    if (on) s += (s.empty() ? "" : "+") + std::string(what);
  };
  add(tr::adds_to_embeddings, "embeddings");
  add(tr::rotates_queries_keys, "rotate q,k");
  add(tr::biases_scores, "score bias");
  add(tr::relative_key_value, "rel. k/v");
  return s.empty() ? "nowhere" : s;
}

index_t parameters(posenc::none const&) { return 0; }
template <class T>
index_t parameters(posenc::sinusoidal<T> const&) { return 0; }
template <class T>
index_t parameters(posenc::learned<T> const& e) { return e.table().size(); }
template <class T>
index_t parameters(posenc::rope<T> const&) { return 0; }
template <class T>
index_t parameters(posenc::alibi<T> const&) { return 0; }  // fixed slopes
template <class T>
index_t parameters(posenc::t5_bias<T> const& e) { return e.num_buckets() * e.heads(); }
template <class T>
index_t parameters(posenc::clipped_bias<T> const& e) { return (2 * e.max_distance() + 1) * e.heads(); }
template <class T>
index_t parameters(posenc::shaw<T> const& e) {
  return (2 * e.max_distance() + 1) * e.head_dim() * (e.has_values() ? 2 : 1);
}
template <class T>
index_t parameters(posenc::transformer_xl<T> const& e) {  // u, v and W_R
  return 2 * e.heads() * e.head_dim() + e.heads() * e.head_dim() * e.pos_dim();
}
template <class... E>
index_t parameters(posenc::compose<E...> const& c) {
  return std::apply([](auto const&... p) { return (index_t{0} + ... + parameters(p)); }, c.parts());
}

struct row_stats {
  std::string name, acts;
  bool relative = false;
  index_t params = 0;
  double perm_error = 0, shift_error = 0, entropy = 0, distance = 0;
  std::vector<float> map;  // head 0 probabilities (seq, seq)
};

template <class E>
row_stats measure(std::string name, E const& enc, toy_model const& m) {
  row_stats r;
  r.name = std::move(name);
  r.acts = where_it_acts<E>();
  r.relative = posenc::is_relative_v<E>;
  r.params = parameters(enc);
  attention_result base = run(enc, m, m.x, 0);

  // Permutation equivariance: f(P x) against P f(x), positions staying 0..seq-1.
  std::vector<float> xp(m.x.size());
  for (index_t i = 0; i < seq; ++i)
    std::copy_n(&m.x[m.perm[i] * d_model], d_model, &xp[i * d_model]);
  attention_result permuted = run(enc, m, xp, 0);
  for (index_t i = 0; i < seq; ++i)
    for (index_t c = 0; c < d_model; ++c)
      r.perm_error = std::max(r.perm_error, std::abs(static_cast<double>(permuted.out[i * d_model + c]) -
                                                     base.out[m.perm[i] * d_model + c]));
  // Shift invariance: every position + shift.
  attention_result shifted = run(enc, m, m.x, shift);
  for (std::size_t i = 0; i < base.out.size(); ++i)
    r.shift_error = std::max(r.shift_error, std::abs(static_cast<double>(shifted.out[i]) - base.out[i]));

  // Entropy (nats) and attended distance |i - j|, averaged over heads and queries.
  for (index_t h = 0; h < heads; ++h)
    for (index_t i = 0; i < seq; ++i)
      for (index_t j = 0; j < seq; ++j) {
        double p = base.probs[(h * seq + i) * seq + j];
        if (p > 0) r.entropy -= p * std::log(p);
        r.distance += p * std::abs(static_cast<double>(i - j));
      }
  r.entropy /= heads * seq;
  r.distance /= heads * seq;
  r.map.assign(base.probs.begin(), base.probs.begin() + seq * seq);
  return r;
}

// ---------------------------------------------------------------------------
// Pictures.

struct writer {
  std::string dir;
  void operator()(std::string const& file, px::image const& img, std::string const& what) const {
    std::string path = (std::filesystem::path(dir) / file).string();
    px::write_png(path, img);
    std::printf("  %-40s %4d x %-4d %s\n", path.c_str(), img.width(), img.height(), what.c_str());
  }
};

px::image attention_picture(row_stats const& r) {
  px::heatmap_style s;
  s.title = r.name;
  s.axes = "HEAD 0  ROWS: QUERY  COLS: KEY";
  s.cell_w = s.cell_h = 16;
  s.vmin = 0;
  return px::render_heatmap(r.map.data(), seq, seq, s);
}

/// RoFormer's long-term decay bound: (1 / (d/2)) sum_{j=1..d/2} |sum_{k<j} e^{i m theta_k}|
/// against the relative distance m, with theta_k from the library's own rope frequencies.
std::vector<double> rope_decay(double base, index_t dim, std::vector<double> const& distances) {
  posenc::rope_options o;
  o.base = base;
  posenc::rope<double> r(posenc::rope_layout::half_split, dim, o);
  std::vector<double> theta = r.frequencies(0).inv_freq;
  std::vector<double> y;
  for (double m : distances) {
    std::complex<double> partial = 0;
    double sum = 0;
    for (double t : theta) {
      partial += std::polar(1.0, m * t);
      sum += std::abs(partial);
    }
    y.push_back(sum / static_cast<double>(theta.size()));
  }
  return y;
}

void print_table(std::vector<row_stats> const& rows) {
  std::printf("\n%-22s %-22s %6s %10s %10s %8s %8s\n", "encoder", "acts on (traits)", "params", "perm.err",
              "shift.err", "entropy", "distance");
  for (auto const& r : rows)
    std::printf("%-22s %-22s %6lld %10.2e %10.2e %8.3f %8.3f\n", r.name.c_str(),
                (r.acts + (r.relative ? "" : " (abs)")).c_str(), static_cast<long long>(r.params), r.perm_error,
                r.shift_error, r.entropy, r.distance);
  std::printf(
      "  perm.err  = max |f(P x) - P f(x)| for a fixed token permutation P (positions stay 0..%lld):\n"
      "              ~1e-7 means the model cannot see order; only 'none' is equivariant.\n"
      "  shift.err = max |f(x at positions +%lld) - f(x)|: ~1e-7 for relative encoders (their scores\n"
      "              depend on p_i - p_j only), large for absolute ones.\n"
      "  entropy   = mean -sum_j p_ij ln p_ij (uniform over %lld keys: %.3f); distance = mean sum_j p_ij |i - j|.\n",
      static_cast<long long>(seq - 1), static_cast<long long>(shift), static_cast<long long>(seq),
      std::log(static_cast<double>(seq)));
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir = "tour-out";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      out_dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--out DIR]   (default DIR: tour-out)\n", argv[0]);
      return 2;
    }
  }

  std::printf("posenc %s\n", posenc::version_string());
  std::printf("  SIMD instruction set : %s (%d float lanes)\n", posenc::simd::arch_name(),
              static_cast<int>(posenc::simd::width<float>));
  std::printf("  threads              : %d (%s)\n", posenc::default_threads(),
              posenc::has_openmp() ? "OpenMP" : "serial build");

  // --- The absolute encoders up close -------------------------------------
  std::printf("\nSinusoidal table, d_model 8, interleaved (sin on even, cos on odd columns):\n");
  posenc::sinusoidal<float> small_sin(8);
  std::vector<float> rows(4 * 8);
  small_sin.fill(0, 4, rows);
  for (index_t p = 0; p < 4; ++p) {
    std::printf("  PE[%lld] =", static_cast<long long>(p));
    for (index_t c = 0; c < 8; ++c) std::printf(" %+.4f", rows[p * 8 + c]);
    std::printf("\n");
  }
  // A RoBERTa-style learned table: rows 0 and 1 are reserved, position p reads row p + 2.
  auto roberta_like = posenc::learned<float>::random(16, 4, /*seed=*/7, /*offset=*/2);
  std::printf("Learned table (16 rows x 4, offset 2 as in RoBERTa): position 0 reads row 2:\n  PE[0] =");
  for (index_t c = 0; c < 4; ++c) std::printf(" %+.4f", roberta_like.value(0, c));
  std::printf("\n  row 2 =");
  for (index_t c = 0; c < 4; ++c) std::printf(" %+.4f", roberta_like.table()[2 * 4 + c]);
  std::printf("\n  usable positions: %lld (table rows - offset)\n",
              static_cast<long long>(roberta_like.max_positions()));

  // --- Every encoder on the same toy sequence ------------------------------
  toy_model const m(20240611);
  std::printf("\nToy self-attention: %lld tokens, d_model %lld, %lld heads of %lld, seeded; bidirectional.\n",
              static_cast<long long>(seq), static_cast<long long>(d_model), static_cast<long long>(heads),
              static_cast<long long>(head_dim));

  // Learned tables and relative tables are seeded; their scales are chosen so
  // that each encoding is visible next to unit-variance embeddings and scores.
  auto const learned_enc = posenc::learned<float>::random(128, d_model, /*seed=*/11, 0, /*stddev=*/0.5);
  posenc::rope<float> const rope_enc(posenc::rope_layout::half_split, head_dim);
  posenc::rope_options yarn_opt;
  yarn_opt.scaling = posenc::rope_scaling::yarn(/*factor=*/4.0, /*original_max_position_embeddings=*/8);
  posenc::rope<float> const yarn_enc(posenc::rope_layout::half_split, head_dim, yarn_opt);
  posenc::alibi<float> const alibi_enc(posenc::alibi_form::symmetric, heads);
  posenc::t5_bias_params t5p;
  t5p.heads = heads;
  posenc::t5_bias<float> const t5_enc(t5p, /*seed=*/12, /*stddev=*/1.0);
  posenc::clipped_bias<float> const clipped_enc(/*max_distance=*/4, heads, /*seed=*/13, /*stddev=*/1.0);
  posenc::shaw<float> const shaw_enc(/*max_distance=*/4, head_dim, posenc::shaw_terms::keys_and_values,
                                     /*seed=*/14, /*stddev=*/0.5);
  posenc::compose<posenc::rope<float>, posenc::alibi<float>> const rope_alibi(rope_enc, alibi_enc);
  // Transformer-XL: u, v (heads, head_dim) and W_R (heads x head_dim, d_model), seeded; distances up to seq - 1.
  auto txl_table = [](index_t n_rows, index_t n_cols, std::uint64_t seed, double scale) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> n01(0.0, scale);
    posenc::relative_table<float> t(n_rows, n_cols);
    for (index_t r = 0; r < n_rows; ++r)
      for (index_t c = 0; c < n_cols; ++c) t(r, c) = static_cast<float>(n01(gen));
    return t;
  };
  posenc::transformer_xl<float> const txl_enc(seq - 1, txl_table(heads, head_dim, 15, 0.5),
                                              txl_table(heads, head_dim, 16, 0.5),
                                              txl_table(heads * head_dim, d_model, 17, 0.25));

  std::vector<row_stats> table;
  table.push_back(measure("none", posenc::none{}, m));
  table.push_back(measure("sinusoidal", posenc::sinusoidal<float>(d_model), m));
  table.push_back(measure("learned", learned_enc, m));
  table.push_back(measure("rope half-split", rope_enc, m));
  table.push_back(measure("rope + yarn x4 (L0 8)", yarn_enc, m));
  table.push_back(measure("alibi symmetric", alibi_enc, m));
  table.push_back(measure("t5 buckets 32/128", t5_enc, m));
  table.push_back(measure("clipped bias k=4", clipped_enc, m));
  table.push_back(measure("shaw k=4 (keys+values)", shaw_enc, m));
  table.push_back(measure("rope + alibi", rope_alibi, m));
  table.push_back(measure("transformer-xl", txl_enc, m));
  print_table(table);

  // What the table must show; the tour fails (and ctest with it) when it does not.
  int unexpected = 0;
  for (auto const& r : table) {
    bool const is_none = r.name == "none";
    auto expect = [&](bool ok, char const* what) {
      if (!ok) {
        std::printf("UNEXPECTED: %s: %s\n", r.name.c_str(), what);
        ++unexpected;
      }
    };
    expect(is_none ? r.perm_error < 1e-4 : r.perm_error > 1e-3,
           is_none ? "perm.err should be ~0 without an encoder" : "perm.err should be large (order is visible)");
    expect(r.relative ? r.shift_error < 1e-4 : r.shift_error > 1e-3,
           r.relative ? "shift.err should be ~0 for a relative encoder" : "shift.err should be large (absolute)");
  }
  std::printf("%s\n", unexpected == 0 ? "Checks: every row behaves as its traits say." : "Checks FAILED.");

  // --- Pictures -------------------------------------------------------------
  std::filesystem::create_directories(out_dir);
  writer write{out_dir};
  std::printf("\nPictures:\n");

  {  // The sinusoidal table: positions 0..127 x dims 0..511.
    posenc::sinusoidal<float> enc(512);
    std::vector<float> t(128 * 512);
    enc.fill(0, 128, t);
    px::heatmap_style s;
    s.title = "SINUSOIDAL PE, D_MODEL 512, INTERLEAVED";
    s.axes = "ROWS: POSITION  COLS: DIMENSION";
    s.diverging = true;
    s.vmin = -1;
    s.vmax = 1;
    write("sinusoidal_table.png", px::render_heatmap(t.data(), 128, 512, s), "sinusoidal table");
  }

  char const* files[] = {"none", "sinusoidal", "learned", "rope", "rope_yarn", "alibi", "t5", "clipped",
                         "shaw", "rope_alibi", "transformer_xl"};
  std::vector<px::image> maps;
  for (std::size_t i = 0; i < table.size(); ++i) {
    maps.push_back(attention_picture(table[i]));
    write(std::string("attention_") + files[i] + ".png", maps.back(), "attention map, " + table[i].name);
  }
  write("attention_all.png", px::side_by_side(maps, 5, 8), "all attention maps");

  {  // Transformer-XL, head 0: the content term scale (q_i + u) . k_j, the position term
     // scale (q_i + v) . R(i - j) and their sum, which must be the library's raw scores.
    std::vector<float> q = project(m.x, m.wq), k = project(m.x, m.wk), v = project(m.x, m.wv);
    std::vector<float> raw(heads * seq * seq), out(seq * d_model);
    posenc::attention_options<float> opt;
    opt.scores = raw;
    opt.scores_stage = posenc::score_stage::raw;
    posenc::attention<posenc::path::materialized>(
        posenc::make_bshd<const float>(q.data(), 1, seq, heads, head_dim),
        posenc::make_bshd<const float>(k.data(), 1, seq, heads, head_dim),
        posenc::make_bshd<const float>(v.data(), 1, seq, heads, head_dim),
        posenc::make_bshd(out.data(), 1, seq, heads, head_dim), txl_enc, opt);
    float const scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    std::vector<float> content(seq * seq), position(seq * seq, 0.0f), total(seq * seq);
    double mismatch = 0;
    for (index_t i = 0; i < seq; ++i) {
      float const* qi = &q[i * d_model];  // head 0: the first head_dim values of the token
      txl_enc.add_position_scores(0, posenc::span<const float>(qi, head_dim), i, 0, scale,
                                  posenc::span<float>(&position[i * seq], seq));
      for (index_t j = 0; j < seq; ++j) {
        float c = 0;
        for (index_t d = 0; d < head_dim; ++d) c += (qi[d] + txl_enc.content_bias(0)[d]) * k[j * d_model + d];
        content[i * seq + j] = scale * c;
        total[i * seq + j] = content[i * seq + j] + position[i * seq + j];
        mismatch = std::max(mismatch, std::abs(static_cast<double>(total[i * seq + j]) - raw[i * seq + j]));
      }
    }
    if (mismatch > 1e-4) {
      std::printf("UNEXPECTED: transformer-xl: content + position terms differ from the raw scores by %g\n",
                  mismatch);
      ++unexpected;
    }
    double a = 0;
    for (float x : total) a = std::max(a, std::abs(static_cast<double>(x)));
    for (float x : content) a = std::max(a, std::abs(static_cast<double>(x)));
    for (float x : position) a = std::max(a, std::abs(static_cast<double>(x)));
    std::vector<px::image> panels;
    for (auto const& [title, map] : {std::pair<char const*, std::vector<float> const*>{"CONTENT (Q+U).K", &content},
                                     {"POSITION (Q+V).R(I-J)", &position},
                                     {"SUM: RAW SCORES", &total}}) {
      px::heatmap_style s;
      s.title = title;
      s.axes = "HEAD 0  ROWS: QUERY  COLS: KEY";
      s.cell_w = s.cell_h = 16;
      s.diverging = true;  // one range for the three panels: white is 0
      s.vmin = -a;
      s.vmax = a;
      panels.push_back(px::render_heatmap(map->data(), seq, seq, s));
    }
    write("transformer_xl_terms.png", px::side_by_side(panels, 3, 8),
          "Transformer-XL content and position terms (head 0)");
  }

  {  // T5 buckets (defaults 32 / 128, bidirectional) over 128 queries x 128 keys.
    std::vector<float> b(128 * 128);
    for (index_t i = 0; i < 128; ++i)
      for (index_t j = 0; j < 128; ++j) b[i * 128 + j] = static_cast<float>(t5_enc.bucket(j - i));
    px::heatmap_style s;
    s.title = "T5 BUCKET OF KEY - QUERY (32 / 128)";
    s.axes = "ROWS: QUERY  COLS: KEY";
    s.cell_w = s.cell_h = 2;
    write("t5_buckets.png", px::render_heatmap(b.data(), 128, 128, s), "T5 bucket map");
  }

  {  // ALiBi of an 8-head model (slopes 1/2 .. 1/256): four heads over 32 queries x 32 keys.
    posenc::alibi<float> const eight(posenc::alibi_form::symmetric, 8);
    std::vector<px::image> panels;
    for (index_t h : {0, 1, 3, 7}) {
      std::vector<float> b(32 * 32, 0.0f);
      for (index_t i = 0; i < 32; ++i) eight.bias_row(h, i, 0, 32, &b[i * 32]);
      px::heatmap_style s;
      char title[64];
      std::snprintf(title, sizeof title, "ALIBI HEAD %lld OF 8, SLOPE 1/%.0f", static_cast<long long>(h),
                    1.0 / eight.slope(h));
      s.title = title;
      s.axes = "ROWS: QUERY  COLS: KEY";
      s.cell_w = s.cell_h = 4;
      s.diverging = true;  // each panel its own range: read the colorbars
      panels.push_back(px::render_heatmap(b.data(), 32, 32, s));
    }
    write("alibi_bias.png", px::side_by_side(panels, 4, 8), "ALiBi bias map (symmetric form, 8 heads)");
  }

  {  // RoPE long-term decay, head_dim 128, bases 1e4 and 5e5.
    std::vector<double> d;
    for (double e = 0; e <= 5.0 + 1e-9; e += 0.01) {
      double v = std::round(std::pow(10.0, e));
      if (d.empty() || v != d.back()) d.push_back(v);
    }
    px::plot_style s;
    s.title = "ROPE LONG-TERM DECAY, HEAD_DIM 128";
    s.axes = "X: RELATIVE DISTANCE (LOG)  Y: RELATIVE UPPER BOUND";
    s.log_x = true;
    std::vector<px::curve> c = {{"BASE 1E4", d, rope_decay(1e4, 128, d), px::viridis(0.15)},
                                {"BASE 5E5", d, rope_decay(5e5, 128, d), px::viridis(0.75)}};
    write("rope_decay.png", px::render_curves(c, s), "RoPE long-term decay");
  }

  {  // The learned table (128 positions) beside its linear interpolation to 256.
    auto longer = learned_enc.extended(256);
    px::heatmap_style s;
    s.diverging = true;
    double a = 0;
    for (float v : learned_enc.table()) a = std::max(a, std::abs(static_cast<double>(v)));
    s.vmin = -a;
    s.vmax = a;
    s.axes = "ROWS: POSITION  COLS: DIMENSION";
    s.title = "LEARNED, 128 POSITIONS";
    s.cell_w = 4;
    s.cell_h = 2;
    px::image before = px::render_heatmap(learned_enc.table().data(), 128, d_model, s);
    s.title = "INTERPOLATED TO 256";
    s.cell_h = 1;
    std::vector<float> after(longer.table().data(), longer.table().data() + longer.table().size());
    px::image after_img = px::render_heatmap(after.data(), 256, d_model, s);
    write("learned_interpolation.png", px::side_by_side({before, after_img}, 2, 8),
          "learned table, before / after extended(256)");
  }
  return unexpected == 0 ? 0 : 1;
}
