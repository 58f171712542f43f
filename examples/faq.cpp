// SPDX-License-Identifier: MIT
// The code of docs/faq.md, built and run: each answer's snippet, then a check of what the answer says.
//
// Every snippet sits between "// [faq-<name>]" markers and appears verbatim in
// docs/faq.md. The program returns 1 when a check fails.
#include <posenc/posenc.hpp>

#include <cmath>
#include <limits>
#include <cstdio>
#include <random>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, char const* what) {
  std::printf("  %s  %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& e : v) e = d(gen);
  return v;
}

using posenc::index_t;

// Views: Hugging Face tensors are [batch, heads, seq, dim]; posenc's logical order is (batch, seq, head, dim).
void views() {
  std::printf("layouts of the tensors\n");
  index_t const batch = 1, heads = 4, seq = 6, dim = 8;
  std::vector<float> q = random_vector(batch * heads * seq * dim, 1), k = random_vector(q.size(), 2),
                     v = random_vector(q.size(), 3), out(q.size());
  // [faq-views]
  // q, k, v, out hold [batch, heads, seq, dim] (Hugging Face order): say so with make_bhsd.
  auto qv = posenc::make_bhsd(q.data(), batch, heads, seq, dim);
  auto kv = posenc::make_bhsd(k.data(), batch, heads, seq, dim);
  auto vv = posenc::make_bhsd(v.data(), batch, heads, seq, dim);
  auto ov = posenc::make_bhsd(out.data(), batch, heads, seq, dim);
  posenc::attention(qv, kv, vv, ov, posenc::none{});
  // [faq-views]

  // The same data read as if it were (batch, seq, head, dim) is another problem with the same shape.
  std::vector<float> wrong(q.size());
  posenc::attention(posenc::make_bshd(q.data(), batch, seq, heads, dim), posenc::make_bshd(k.data(), batch, seq, heads, dim),
                    posenc::make_bshd(v.data(), batch, seq, heads, dim),
                    posenc::make_bshd(wrong.data(), batch, seq, heads, dim), posenc::none{});
  double diff = 0;
  for (std::size_t i = 0; i < out.size(); ++i) diff = std::max(diff, std::abs(double(out[i]) - wrong[i]));
  check(diff > 1e-2, "reading a [b, h, s, d] buffer as (b, s, h, d) gives other numbers, silently");
}

// RoPE pair layouts: half-split (HF) and interleaved (Meta, GPT-J) are different rotations of the same vector.
void rope_layouts() {
  std::printf("RoPE pair layout\n");
  index_t const head_dim = 128;
  // [faq-rope-layout]
  // Hugging Face checkpoints (LLaMA, Mistral, Qwen, GPT-NeoX, Phi): pairs (x[k], x[k + r/2]).
  posenc::rope<float> hf_format(posenc::rope_layout::half_split, head_dim);
  // Meta's original LLaMA weights, GPT-J, RoFormer: pairs (x[2k], x[2k+1]).
  posenc::rope<float> meta_format(posenc::rope_layout::interleaved, head_dim);
  // [faq-rope-layout]
  std::vector<float> x = random_vector(head_dim, 4), a = x, b = x;
  hf_format.rotate(posenc::make_bshd(a.data(), 1, 1, 1, head_dim), posenc::position_span(100));
  meta_format.rotate(posenc::make_bshd(b.data(), 1, 1, 1, head_dim), posenc::position_span(100));
  double diff = 0;
  for (index_t i = 0; i < head_dim; ++i) diff = std::max(diff, std::abs(double(a[i]) - b[i]));
  check(diff > 0.1, "the two layouts rotate the same vector differently (a wrong layout is a silent error)");
  // interleaved(x) = P^-1 half(P x), P sending component 2k -> k and 2k+1 -> k + r/2 (docs/formulas.md 3.2).
  std::vector<float> px(head_dim);
  for (index_t k = 0; k < head_dim / 2; ++k) {
    px[k] = x[2 * k];
    px[k + head_dim / 2] = x[2 * k + 1];
  }
  hf_format.rotate(posenc::make_bshd(px.data(), 1, 1, 1, head_dim), posenc::position_span(100));
  double perm = 0;
  for (index_t k = 0; k < head_dim / 2; ++k) {
    perm = std::max(perm, std::abs(double(px[k]) - b[2 * k]));
    perm = std::max(perm, std::abs(double(px[k + head_dim / 2]) - b[2 * k + 1]));
  }
  check(perm < 1e-5, "interleaved = half-split after permuting the components (what HF's conversion does)");
}

// Offsets: KV-cache positions, learned-table offsets, fairseq/RoBERTa position ids.
void offsets() {
  std::printf("offsets\n");
  index_t const past_len = 5, heads = 2, dim = 8, batch = 1;
  std::vector<float> q = random_vector(1 * heads * dim, 5), k = random_vector((past_len + 1) * heads * dim, 6),
                     v = random_vector(k.size(), 7), out_default(q.size()), out_explicit(q.size());
  auto qv = posenc::make_bshd(q.data(), batch, 1, heads, dim);
  auto kv = posenc::make_bshd(k.data(), batch, past_len + 1, heads, dim);
  auto vv = posenc::make_bshd(v.data(), batch, past_len + 1, heads, dim);
  posenc::rope<float> rope(posenc::rope_layout::half_split, dim);
  {
    posenc::attention_options<float> opt;
    opt.causal = true;
    posenc::attention(qv, kv, vv, posenc::make_bshd(out_default.data(), batch, 1, heads, dim), rope, opt);
  }
  // [faq-offsets-cache]
  // One new token after past_len cached ones: Sq = 1, Sk = past_len + 1.
  // The query's position defaults to Sk - Sq = past_len (bottom-right), which
  // is what a KV cache needs; written out, it is:
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.q_positions = posenc::position_span(past_len);  // keys: 0 .. past_len
  // [faq-offsets-cache]
  posenc::attention(qv, kv, vv, posenc::make_bshd(out_explicit.data(), batch, 1, heads, dim), rope, opt);
  double diff = 0;
  for (std::size_t i = 0; i < q.size(); ++i) diff = std::max(diff, std::abs(double(out_default[i]) - out_explicit[i]));
  check(diff == 0.0, "the default query position of a decode step is past_len");

  std::vector<float> bart_weights = random_vector(18 * 8, 8);
  // [faq-offsets-learned]
  // BART / mBART / OPT tables have 2 extra leading rows: position p reads row p + 2.
  auto bart = posenc::learned<float>::copy_of(bart_weights, /*rows=*/18, /*d_model=*/8, /*offset=*/2);
  // RoBERTa / XLM-R: ids come from the tokens (padding_idx 1), so padding reads
  // row 1 and the first real token row 2, whatever the padding side; offset 0.
  std::vector<posenc::index_t> tokens = {1, 1, 0, 31, 7, 2};  // (batch 1, seq 6), left-padded
  std::vector<posenc::index_t> ids(tokens.size());
  posenc::fairseq_positions(tokens, /*batch=*/1, /*seq=*/6, /*padding_idx=*/1, ids);  // 1 1 2 3 4 5
  auto roberta = bart.with_offset(0);
  std::vector<float> x(6 * 8, 0.0f);
  roberta.add_to(posenc::make_bsd(x.data(), 1, 6, 8), posenc::position_span::ids(ids.data(), 1, 6));
  // [faq-offsets-learned]
  check(bart.value(0, 3) == bart_weights[2 * 8 + 3], "BART position 0 reads table row 2");
  check(ids[0] == 1 && ids[1] == 1 && ids[2] == 2 && ids[5] == 5, "RoBERTa ids: padding 1, first real token 2");
  check(x[2 * 8 + 0] == bart_weights[2 * 8 + 0] && x[0] == bart_weights[1 * 8 + 0],
        "RoBERTa: the first real token gets row 2, padding row 1");
}

// Partial rotary: only the first rotary_dim components turn.
void partial_rotary() {
  std::printf("partial rotary\n");
  // [faq-partial]
  // Phi-2: head_dim 80, partial_rotary_factor 0.4 -> rotary_dim = int(80 * 0.4) = 32.
  posenc::rope_options o;
  o.rotary_dim = 32;  // frequencies use 32 in the exponent: theta_k = base^(-2k/32)
  posenc::rope<float> phi2(posenc::rope_layout::half_split, /*head_dim=*/80, o);
  // [faq-partial]
  std::vector<float> x = random_vector(80, 9), y = x;
  phi2.rotate(posenc::make_bshd(y.data(), 1, 1, 1, 80), posenc::position_span(7));
  bool tail_same = true, head_moved = false;
  for (int i = 0; i < 80; ++i) {
    if (i >= 32) tail_same = tail_same && x[i] == y[i];
    if (i < 32) head_moved = head_moved || std::abs(x[i] - y[i]) > 1e-3f;
  }
  check(tail_same && head_moved, "components 32..79 pass through unchanged, 0..31 rotate");
  auto f = phi2.frequencies(0);
  check(f.inv_freq.size() == 16 && std::abs(f.inv_freq[1] - std::pow(10000.0, -2.0 / 32)) < 1e-15,
        "16 frequencies with exponent -2k/32 (rotary_dim, not head_dim)");
}

// Scaling: take the rule and its numbers from the checkpoint's config.
void scaling() {
  std::printf("RoPE scaling\n");
  // [faq-scaling]
  // Llama 3.1 config.json: "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3",
  //   "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
  //   "original_max_position_embeddings": 8192}
  posenc::rope_options llama31;
  llama31.base = 500000.0;
  llama31.scaling = posenc::rope_scaling::llama3(8.0, 1.0, 4.0, 8192);
  posenc::rope<float> rope_llama31(posenc::rope_layout::half_split, 128, llama31);
  // Qwen2.5 long context: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
  posenc::rope_options qwen;
  qwen.base = 1000000.0;
  qwen.scaling = posenc::rope_scaling::yarn(4.0, 32768);
  posenc::rope<float> rope_qwen(posenc::rope_layout::half_split, 128, qwen);
  // [faq-scaling]
  auto fl = rope_llama31.frequencies(0), fq = rope_qwen.frequencies(0);
  check(fl.attention_factor == 1.0, "llama3 scaling: attention factor 1");
  check(std::abs(fq.attention_factor - (0.1 * std::log(4.0) + 1.0)) < 1e-12, "yarn: attention factor 0.1 ln(s) + 1");
  check(std::abs(fl.inv_freq[0] - 1.0) < 1e-15 && std::abs(fl.inv_freq[63] - std::pow(500000.0, -126.0 / 128) / 8) < 1e-15,
        "llama3: the fastest pair keeps theta, the slowest is divided by 8");
}

// A row that sees no key: zeros and log-sum-exp = -inf, never NaN.
void masked_rows() {
  std::printf("fully masked rows\n");
  index_t const seq = 4, heads = 2, dim = 8;
  std::vector<float> q = random_vector(seq * heads * dim, 10), k = random_vector(q.size(), 11),
                     v = random_vector(q.size(), 12), o(q.size(), 123.0f);
  auto qv = posenc::make_bshd(q.data(), 1, seq, heads, dim);
  auto kv = posenc::make_bshd(k.data(), 1, seq, heads, dim);
  auto vv = posenc::make_bshd(v.data(), 1, seq, heads, dim);
  auto ov = posenc::make_bshd(o.data(), 1, seq, heads, dim);
  // [faq-masked]
  // Causal, queries at positions -1, 0, 1, 2 over keys at 0 .. 3: query 0 sees no key.
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.q_positions = posenc::position_span(-1);
  std::vector<float> lse(1 * heads * seq);  // (batch, head, query)
  opt.lse = lse;
  posenc::attention(qv, kv, vv, ov, posenc::none{}, opt);
  // out(0, 0, h, :) == 0 and lse[h * seq + 0] == -inf for every head h
  // [faq-masked]
  bool zeros = true, finite = true;
  for (index_t h = 0; h < heads; ++h)
    for (index_t d = 0; d < dim; ++d) zeros = zeros && ov(0, 0, h, d) == 0.0f;
  for (float e : o) finite = finite && std::isfinite(e);
  check(zeros && finite, "the masked row is zeros, no NaN anywhere");
  check(std::isinf(lse[0]) && lse[0] < 0 && std::isinf(lse[seq]) && std::isfinite(lse[1]), "its lse is -inf");

  // A large finite negative mask value (HF's finfo.min) does not mask: the row gets uniform weights.
  std::vector<float> mask(seq * seq, 0.0f);
  for (index_t j = 0; j < seq; ++j) mask[j] = std::numeric_limits<float>::lowest();  // row 0 only
  posenc::attention_options<float> m;
  m.mask = posenc::make_mask(mask.data(), 1, 1, seq, seq);
  posenc::attention(qv, kv, vv, ov, posenc::none{}, m);
  double worst = 0;
  for (index_t h = 0; h < heads; ++h)
    for (index_t d = 0; d < dim; ++d) {
      double mean = 0;
      for (index_t j = 0; j < seq; ++j) mean += vv(0, j, h, d) / double(seq);
      worst = std::max(worst, std::abs(ov(0, 0, h, d) - mean));
    }
  check(worst < 1e-5, "a finfo.min mask row attends uniformly (the mean of the values), as in HF eager");
}

// Precision at long positions: angles in double, one rounding at the end.
void precision() {
  std::printf("precision at long positions\n");
  // [faq-precision]
  posenc::rope<float> rope(posenc::rope_layout::half_split, 128);
  std::vector<float> cos(64), sin(64);
  rope.cos_sin(/*position=*/131071, /*length=*/131072, cos.data(), sin.data());
  // cos[k] is cos(131071 * theta_k) computed in double and rounded once to float.
  // [faq-precision]
  double ours = 0, naive = 0;
  for (int k = 0; k < 64; ++k) {
    double const theta = std::pow(10000.0, -2.0 * k / 128);
    double const exact = std::cos(131071.0 * theta);
    float const theta_f = std::pow(10000.0f, -2.0f * static_cast<float>(k) / 128.0f);  // float32 as HF does
    float const naive_cos = std::cos(131071.0f * theta_f);
    ours = std::max(ours, std::abs(cos[k] - exact));
    naive = std::max(naive, std::abs(double(naive_cos) - exact));
  }
  std::printf("        max |cos error| at position 131071: posenc %.1e, float32 angles %.1e\n", ours, naive);
  check(ours < 1e-7, "posenc's float cos/sin are within one float rounding of the exact value");
  check(naive > 1e-4, "angles formed in float32 are far off at that position");
}

}  // namespace

int main() {
  views();
  rope_layouts();
  offsets();
  partial_rotary();
  scaling();
  masked_rows();
  precision();
  std::printf("%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
