// SPDX-License-Identifier: MIT
// The lab's model: whole-model gradient, training, determinism, checkpoints, control encoders.
#include "bench.hpp"
#include "checkpoint.hpp"
#include "encoders.hpp"
#include "train.hpp"

#include "support/catch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

using posenc_test::contains;

namespace {

/// The first 20000 bytes of the training text; a clear failure when the corpus is missing.
std::string corpus_slice() {
  try {
    return lab::load_corpus().train.substr(0, 20000);
  } catch (std::exception const& e) {
    FAIL(std::string(e.what()) + " (the lab tests train on it)");
  }
  return {};
}

lab::config tiny(std::string const& lower, std::string const& upper) {
  lab::config c;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  c.seq = 6;
  c.batch = 2;
  c.mlp = 2;
  c.lower = lab::parse_encoding(lower);
  c.upper = lab::parse_encoding(upper);
  c.split = 1;
  return c;
}

lab::config small(std::string const& name) {
  lab::config c;
  c.d_model = 32;
  c.heads = 2;
  c.seq = 32;
  c.batch = 4;
  c.lower = c.upper = lab::parse_encoding(name);
  return c;
}

lab::batch_tokens random_tokens(int batch, int seq, std::uint64_t seed) {
  lab::normal_source rng(seed);
  lab::batch_tokens b;
  b.batch = batch;
  b.seq = seq;
  for (int i = 0; i < batch * seq; ++i) {
    b.inputs.push_back(static_cast<int>(rng.below(256)));
    b.targets.push_back(static_cast<int>(rng.below(256)));
  }
  return b;
}

std::string temp_path(std::string const& name) {
  return (std::filesystem::temp_directory_path() / ("posenc_lab_" + name)).string();
}

}  // namespace

// The step: central differences have truncation error ~h^2 f''' and rounding error ~eps |f| / h;
// with f ~ 5.5 nats in double, h = 1e-5 makes both about 1e-10, far below the 1e-6 (relative to
// the largest gradient) the check asks for, so a wrong term of the backward pass cannot hide.
TEST_CASE("lab: the whole model's gradient matches central differences in double", "[lab]") {
  std::vector<std::pair<std::string, std::string>> const cases = {
      {"none", "none"},      {"sinusoidal", "sinusoidal"}, {"learned", "learned"}, {"rope", "rope"},
      {"alibi", "alibi"},    {"t5", "t5"},                 {"clipped", "clipped"}, {"shaw", "shaw"},
      {"rope+alibi", "rope+alibi"}, {"learned+t5", "learned+t5"}, {"integer", "integer"}, {"zero", "zero"},
      {"noise", "noise"},    {"learned", "rope"},          {"rope", "alibi"}};
  for (auto const& [lower, upper] : cases) {
    lab::model<double> m(tiny(lower, upper));
    auto b = random_tokens(2, 6, 7);
    m.loss_and_grad(b);
    auto const g = m.grads();
    double gmax = 0;
    for (double v : g) gmax = std::max(gmax, std::abs(v));
    auto& p = m.params();
    double const h = 1e-5;
    double worst = 0;
    for (auto const& blk : m.layout().blocks()) {
      // every entry of small blocks, every 7th of large ones (the embedding: only rows in use)
      std::size_t stride = blk.size() > 300 ? 7 : 1;
      for (std::size_t i = blk.offset; i < blk.offset + blk.size(); i += stride) {
        double const keep = p[i];
        p[i] = keep + h;
        double up = m.loss(b);
        p[i] = keep - h;
        double down = m.loss(b);
        p[i] = keep;
        worst = std::max(worst, std::abs((up - down) / (2 * h) - g[i]));
      }
    }
    INFO("encoding " << lower << " | " << upper << ": largest gradient " << gmax << ", worst difference " << worst);
    CHECK(gmax > 1e-3);
    CHECK(worst <= 1e-6 * gmax);
  }
}

TEST_CASE("lab: 20 training steps lower the loss", "[lab]") {
  std::string text = corpus_slice();
  lab::model<float> m(small("rope"));
  auto r = lab::train(m, text, 20);
  REQUIRE(r.losses.size() == 20);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += r.losses[static_cast<std::size_t>(i)] / 5;
    last += r.losses[static_cast<std::size_t>(15 + i)] / 5;
  }
  INFO("mean loss of steps 1-5: " << first << ", of steps 16-20: " << last);
  CHECK(last < first - 0.3);
}

TEST_CASE("lab: the same run twice gives bit-identical losses", "[lab]") {
  std::string text = corpus_slice();
  for (int threads : {1, 2}) {
    for (std::string name : {"t5", "learned+t5", "shaw"}) {
      lab::config c = small(name);
      c.threads = threads;
      lab::model<float> a(c), b(c);
      auto ra = lab::train(a, text, 8), rb = lab::train(b, text, 8);
      INFO(name << " on " << threads << " threads");
      CHECK(ra.losses == rb.losses);
      CHECK(a.params() == b.params());
    }
  }
}

TEST_CASE("lab: a checkpoint round trip gives the same model", "[lab]") {
  std::string text = corpus_slice();
  lab::config c = small("learned+t5");
  c.lower = lab::parse_encoding("rope");
  c.split = 1;
  lab::model<float> m(c);
  lab::train(m, text, 3);
  std::string path = temp_path("round_trip.ckpt");
  lab::save_checkpoint(path, m, 3);
  auto l = lab::load_checkpoint<float>(path);
  CHECK(l.steps == 3);
  CHECK(l.net.cfg().lower == c.lower);
  CHECK(l.net.cfg().upper == c.upper);
  CHECK(l.net.cfg().split == 1);
  CHECK(l.net.params() == m.params());
  auto b = random_tokens(4, 32, 3);
  CHECK(l.net.loss(b) == m.loss(b));
  std::filesystem::remove(path);
}

TEST_CASE("lab: a corrupt, truncated or foreign checkpoint is rejected with a clear error", "[lab]") {
  lab::model<float> m(small("t5"));
  std::string good = temp_path("good.ckpt"), bad = temp_path("bad.ckpt");
  lab::save_checkpoint(good, m, 0);
  std::string bytes;
  {
    std::ifstream f(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto write_bad = [&](std::string const& b) {
    std::ofstream f(bad, std::ios::binary | std::ios::trunc);
    f << b;
  };
  write_bad(bytes.substr(0, bytes.size() / 2));
  REQUIRE_THROWS_WITH(lab::load_checkpoint<float>(bad), contains("truncated: "));
  write_bad(bytes.substr(0, 40));
  REQUIRE_THROWS_WITH(lab::load_checkpoint<float>(bad), contains("truncated in the header"));
  write_bad("# a text file, not a checkpoint\n");
  REQUIRE_THROWS_WITH(lab::load_checkpoint<float>(bad), contains("not a lab checkpoint"));
  std::string flipped = bytes;
  flipped[200] = static_cast<char>(flipped[200] ^ 0x10);
  write_bad(flipped);
  REQUIRE_THROWS_WITH(lab::load_checkpoint<float>(bad), contains("parameter hash differs"));
  std::string version = bytes;
  version[8] = 9;
  write_bad(version);
  REQUIRE_THROWS_WITH(lab::load_checkpoint<float>(bad), contains("format version is 9, expected 1"));
  REQUIRE_THROWS_WITH(lab::load_checkpoint<double>(good), contains("bytes per parameter is 4, expected 8"));
  REQUIRE_THROWS_WITH(lab::load_checkpoint<float>(temp_path("missing.ckpt")), contains("cannot open"));
  std::filesystem::remove(good);
  std::filesystem::remove(bad);
}

namespace {
/// x = ones (1, seq, d) plus enc at positions first .. first + seq - 1.
template <class E>
std::vector<float> encoded(E const& enc, int first, int seq, int d) {
  std::vector<float> x(static_cast<std::size_t>(seq * d), 1.0f);
  enc.add_to(posenc::make_bsd(x.data(), 1, seq, d), posenc::position_span(first));
  return x;
}

/// The trait properties shared by the absolute encoders (sinusoidal, learned and the controls).
template <class E>
void check_absolute_traits() {
  using tr = posenc::encoder_traits<E>;
  STATIC_REQUIRE(tr::adds_to_embeddings);
  STATIC_REQUIRE_FALSE(tr::rotates_queries_keys);
  STATIC_REQUIRE_FALSE(tr::biases_scores);
  STATIC_REQUIRE_FALSE(tr::relative_key_value);
  STATIC_REQUIRE_FALSE(tr::is_relative);
}
}  // namespace

TEST_CASE("lab: the control encoders keep the encoder contract as the library's absolute encoders do", "[lab]") {
  check_absolute_traits<posenc::sinusoidal<float>>();
  check_absolute_traits<posenc::learned<float>>();
  check_absolute_traits<lab::integer_position<float>>();
  check_absolute_traits<lab::zero_position<float>>();
  check_absolute_traits<lab::noise_position<float>>();

  int const d = 8, s = 5;
  lab::integer_position<float> integer(d);
  lab::zero_position<float> zero(d);
  lab::noise_position<float> noise(64, d, 5);
  posenc::sinusoidal<float> sin_cos(d);

  // Absolute: the added vectors depend on the position itself, so a global shift changes
  // them (as for sinusoidal); zero vectors carry no position at all.
  CHECK(encoded(sin_cos, 0, s, d) != encoded(sin_cos, 3, s, d));
  CHECK(encoded(integer, 0, s, d) != encoded(integer, 3, s, d));
  CHECK(encoded(noise, 0, s, d) != encoded(noise, 3, s, d));
  CHECK(encoded(zero, 0, s, d) == encoded(zero, 3, s, d));
  CHECK(encoded(zero, 0, s, d) == std::vector<float>(static_cast<std::size_t>(s * d), 1.0f));
  // The increasing integer: column 0 of token t gains exactly its position.
  auto x = encoded(integer, 2, s, d);
  for (int t = 0; t < s; ++t) CHECK(x[static_cast<std::size_t>(t * d)] == 1.0f + static_cast<float>(2 + t));
  // The noise table is fixed by its seed.
  CHECK(encoded(noise, 1, s, d) == encoded(lab::noise_position<float>(64, d, 5), 1, s, d));

  // max_positions as the library's: 0 = any position, else the rows.
  CHECK(integer.max_positions() == 0);
  CHECK(zero.max_positions() == 0);
  CHECK(noise.max_positions() == 64);

  // Bad arguments throw posenc::error before writing, in the library's message format.
  std::vector<float> y(static_cast<std::size_t>(s * d), 1.0f), before = y;
  REQUIRE_THROWS_AS(noise.add_to(posenc::make_bsd(y.data(), 1, s, d), posenc::position_span(62)), posenc::error);
  REQUIRE_THROWS_WITH(noise.add_to(posenc::make_bsd(y.data(), 1, s, d), posenc::position_span(62)),
                      "lab::noise_position::add_to: position is 64, expected 0 .. 63");
  REQUIRE_THROWS_WITH(integer.add_to(posenc::make_bsd(y.data(), 1, s, d - 1), posenc::position_span(0)),
                      "lab::integer_position::add_to: x.dim is 7, expected 8 (d_model)");
  CHECK(y == before);
}

TEST_CASE("lab: the corpus splits deterministically into train, validation and test", "[lab]") {
  try {
    auto a = lab::load_corpus(), b = lab::load_corpus();
    CHECK(a.train == b.train);
    CHECK(a.validation == b.validation);
    CHECK(a.test == b.test);
    CHECK(a.validation.size() > 1000);
    CHECK(a.test.size() > 1000);
    CHECK(a.train.size() > 8 * a.validation.size() / 2);
    CHECK(a.train.size() + a.validation.size() + a.test.size() <= a.total_bytes);
  } catch (std::runtime_error const& e) {
    FAIL(e.what());
  }
  REQUIRE_THROWS_WITH(lab::load_corpus("/nonexistent"), contains("install the corpus with scripts/deps.sh"));
}

// bench/lab_torch.py builds its PyTorch model from this line: every field it reads must be there
// and follow the configuration, so the two models cannot drift apart silently.
TEST_CASE("lab: the bench configuration line carries the configuration the PyTorch script reads", "[lab]") {
  lab::config c;
  c.layers = 3;
  c.d_model = 48;
  c.heads = 3;
  c.seq = 40;
  c.batch = 5;
  c.mlp = 2;
  c.warmup = 7;
  c.lower = c.upper = lab::parse_encoding("alibi");
  c.split = c.layers;
  std::string j = lab::config_json(c);
  INFO(j);
  std::string const parameters = "\"parameters\":" + std::to_string(lab::model<float>(c).params().size()) + "}";
  for (std::string field : std::initializer_list<std::string>{"\"vocab\":256", "\"layers\":3", "\"d_model\":48", "\"heads\":3", "\"head_dim\":16",
                            "\"mlp_hidden\":96", "\"seq\":40", "\"batch\":5", "\"encoding\":\"alibi\"",
                            "\"attention_scale\":0.25", "\"lr_warmup_steps\":7", "\"norm\":\"pre\"", "\"gelu\":\"tanh\"",
                            "\"tied_output\":true", "\"dtype\":\"float32\"", "\"clip_global_norm\":1",
                            "\"beta1\":0.9", "\"beta2\":0.9", "\"eps\":1e-08", "\"ln_eps\":1", "\"rope_base\":10000", parameters}) {
    CHECK(j.find(field) != std::string::npos);
  }
  // the paper's slopes of 3 heads, in head order
  std::ostringstream slopes;
  slopes.precision(17);
  slopes << "\"alibi_slopes\":[";
  auto s = posenc::alibi_slopes(3);
  REQUIRE(s.size() == 3);
  for (std::size_t h = 0; h < s.size(); ++h) slopes << (h ? "," : "") << s[h];
  slopes << "]";
  CHECK(j.find(slopes.str()) != std::string::npos);
  CHECK(std::count(j.begin(), j.end(), '{') == 1);
  c.split = 1;
  c.upper = lab::parse_encoding("none");
  CHECK(lab::config_json(c).find("\"encoding\":\"alibi/none\"") != std::string::npos);
}
