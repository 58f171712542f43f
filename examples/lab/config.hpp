// SPDX-License-Identifier: MIT
// The lab's model and training configuration, and the names of its encodings.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace lab {

/// The encoding added to the residual stream (at the first layer of a run of layers using it).
enum class absolute_kind { none, sinusoidal, learned, integer, zero, noise };
/// The encoding inside attention.
enum class attention_kind { none, rope, alibi, t5, clipped, shaw, rope_alibi };
/// How RoPE is evaluated past the training length.
enum class rope_eval { plain, linear, dynamic_ntk, yarn };

/// How token embeddings and absolute encodings are combined at the input (docs/experiments.md):
///   sqrt_d   tokens drawn N(0, 1/sqrt(d_model)) and multiplied by sqrt(d_model) before the
///            position is added, as in the original Transformer; a learned table starts at
///            N(0, 1/sqrt(d_model)). The canonical setup and the default.
///   unscaled tokens and a learned table drawn N(0, 0.02), added as they are (the lab's earlier setup).
///   bert     as unscaled, drawn from BERT's initializer: N(0, 0.02) truncated at two standard deviations.
///   matched  as unscaled, with every fixed position signal scaled so that its mean row norm over
///            the training length equals a token embedding's expected norm, 0.02 sqrt(d_model).
enum class embedding_setup { sqrt_d, unscaled, bert, matched };

/// The setups by name, in the order of the enum.
inline std::vector<std::string> const& embedding_setup_names() {
  static std::vector<std::string> const names = {"sqrt_d", "unscaled", "bert", "matched"};
  return names;
}

/// The setup called `name`; throws std::invalid_argument listing the names otherwise.
inline embedding_setup parse_embedding_setup(std::string const& name) {
  auto const& names = embedding_setup_names();
  std::string all;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<embedding_setup>(i);
    all += (all.empty() ? "" : ", ") + names[i];
  }
  throw std::invalid_argument("lab: --embedding is \"" + name + "\", expected one of " + all);
}

/// The name of setup e.
inline std::string const& embedding_setup_name(embedding_setup e) {
  return embedding_setup_names()[static_cast<std::size_t>(e)];
}

/// One layer's encoding: where it acts in the residual stream and in attention.
struct encoding {
  absolute_kind absolute = absolute_kind::none;
  attention_kind attention = attention_kind::none;
  bool operator==(encoding const& o) const { return absolute == o.absolute && attention == o.attention; }
};

/// The encodings by name; "learned+t5" is both parts.
inline std::vector<std::pair<std::string, encoding>> const& encoding_names() {
  using a = absolute_kind;
  using r = attention_kind;
  static std::vector<std::pair<std::string, encoding>> const names = {
      {"none", {a::none, r::none}},       {"sinusoidal", {a::sinusoidal, r::none}},
      {"learned", {a::learned, r::none}}, {"rope", {a::none, r::rope}},
      {"alibi", {a::none, r::alibi}},     {"t5", {a::none, r::t5}},
      {"clipped", {a::none, r::clipped}}, {"shaw", {a::none, r::shaw}},
      {"rope+alibi", {a::none, r::rope_alibi}}, {"learned+t5", {a::learned, r::t5}},
      {"integer", {a::integer, r::none}}, {"zero", {a::zero, r::none}},
      {"noise", {a::noise, r::none}}};
  return names;
}

/// The encoding called `name`; throws std::invalid_argument listing the names otherwise.
inline encoding parse_encoding(std::string const& name) {
  std::string all;
  for (auto const& [n, e] : encoding_names()) {
    if (n == name) return e;
    all += (all.empty() ? "" : ", ") + n;
  }
  throw std::invalid_argument("lab: encoding is \"" + name + "\", expected one of " + all);
}

/// The name of encoding e.
inline std::string encoding_name(encoding e) {
  for (auto const& [n, x] : encoding_names())
    if (x == e) return n;
  return "?";
}

/// Model shape and training settings. Lower layers use `lower`, the rest `upper`
/// (split at `split`; split == layers means one encoding everywhere).
struct config {
  int layers = 2, d_model = 64, heads = 4, seq = 64, batch = 8;
  int mlp = 4;  ///< MLP width = mlp * d_model
  int split = 2;
  encoding lower{}, upper{};
  embedding_setup embedding = embedding_setup::sqrt_d;
  std::uint64_t seed = 1;
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.99, eps = 1e-8, clip = 1.0;
  int warmup = 20;
  int threads = 1;  ///< attention threads (results are the same for the same count)

  int head_dim() const { return d_model / heads; }
  /// The encoding of layer l.
  encoding layer_encoding(int l) const { return l < split ? lower : upper; }
  /// Throws std::invalid_argument naming the first bad field.
  void check() const {
    auto need = [](bool ok, std::string const& what) {
      if (!ok) throw std::invalid_argument("lab::config: " + what);
    };
    need(layers >= 1, "layers is " + std::to_string(layers) + ", expected >= 1");
    need(heads >= 1 && d_model % heads == 0, "d_model is " + std::to_string(d_model) + ", expected a multiple of heads");
    need(head_dim() % 2 == 0, "head_dim is " + std::to_string(head_dim()) + ", expected even (RoPE)");
    need(seq >= 2 && batch >= 1 && mlp >= 1, "seq, batch or mlp out of range");
    need(split >= 0 && split <= layers, "split is " + std::to_string(split) + ", expected 0 .. layers");
  }
};

/// How a model is evaluated: the sequence length and, past the training length, RoPE's rule
/// and whether a learned table is stretched with learned::extended().
struct eval_mode {
  int length = 0;  ///< 0: the training length
  rope_eval rope = rope_eval::plain;
  bool extend_learned = false;
};

}  // namespace lab
