// SPDX-License-Identifier: MIT
// The code blocks of docs/attention.md, built and checked.
#include <posenc/posenc.hpp>

#include <cmath>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace attention_docs_tests {

using posenc::index_t;

TEST_CASE("docs/attention.md: a causal GQA call with RoPE and the log-sum-exp", "[docs]") {
  index_t const batch = 2, seq = 5, q_heads = 4, kv_heads = 2, head_dim = 8;
  auto q = posenc_test::random_vector<float>(batch * seq * q_heads * head_dim, 1);
  auto k = posenc_test::random_vector<float>(batch * seq * kv_heads * head_dim, 2);
  auto v = posenc_test::random_vector<float>(batch * seq * kv_heads * head_dim, 3);
  std::vector<float> out(q.size()), lse(batch * q_heads * seq);
  // q (batch, seq, 4 heads, 8), k and v (batch, seq, 2 heads, 8): query heads 0, 1 use kv head 0.
  posenc::rope<float> rope(posenc::rope_layout::half_split, head_dim);
  posenc::attention_options<float> opt;
  opt.causal = true;       // query i sees keys at positions <= its own
  opt.lse = lse;    // (batch, q_heads, seq): to merge partial results
  posenc::attention(posenc::make_bshd(q.data(), batch, seq, q_heads, head_dim),
                    posenc::make_bshd(k.data(), batch, seq, kv_heads, head_dim),
                    posenc::make_bshd(v.data(), batch, seq, kv_heads, head_dim),
                    posenc::make_bshd(out.data(), batch, seq, q_heads, head_dim), rope, opt);
  for (float x : out) CHECK(std::isfinite(x));
  for (float x : lse) CHECK(std::isfinite(x));
}

TEST_CASE("docs/attention.md: masks, padding and the scores output", "[docs]") {
  index_t const batch = 2, q_len = 3, k_len = 4, heads = 2, dim = 4;
  auto q = posenc_test::random_vector<float>(batch * q_len * heads * dim, 1);
  auto k = posenc_test::random_vector<float>(batch * k_len * heads * dim, 2);
  auto v = posenc_test::random_vector<float>(batch * k_len * heads * dim, 3);
  std::vector<float> out(q.size());
  std::vector<float> probs(batch * heads * q_len * k_len);
  // One boolean row per query, shared by the batch and the heads (true = attend).
  bool allowed[3][4] = {{true, true, false, false}, {true, false, true, false}, {false, false, false, false}};
  std::vector<index_t> key_lengths{4, 2};  // batch entry 1 has 2 real keys
  posenc::attention_options<float> opt;
  opt.bool_mask = posenc::make_mask<bool>(&allowed[0][0], 1, 1, q_len, k_len);
  opt.key_lengths = key_lengths;
  opt.scores = probs;  // (batch, heads, q_len, k_len)
  opt.scores_stage = posenc::score_stage::probabilities;
  posenc::attention<posenc::path::materialized>(posenc::make_bshd(q.data(), batch, q_len, heads, dim),
                    posenc::make_bshd(k.data(), batch, k_len, heads, dim),
                    posenc::make_bshd(v.data(), batch, k_len, heads, dim),
                    posenc::make_bshd(out.data(), batch, q_len, heads, dim), posenc::none{}, opt);
  // Query 2 sees no key: its output row is zeros, never NaN.
  for (index_t b = 0; b < batch; ++b)
    for (index_t h = 0; h < heads; ++h)
      for (index_t t = 0; t < dim; ++t) CHECK(out[static_cast<std::size_t>(((b * q_len + 2) * heads + h) * dim + t)] == 0.0f);
  // Batch entry 1, query 1 sees only key 0 (key 2 is padding).
  CHECK(probs[static_cast<std::size_t>(((1 * heads + 0) * q_len + 1) * k_len + 0)] == 1.0f);
}

TEST_CASE("docs/attention.md: decoding with a kv_cache", "[docs]") {
  index_t const kv_heads = 2, q_heads = 4, head_dim = 8, steps = 6;
  posenc::rope<float> rope(posenc::rope_layout::half_split, head_dim);
  std::vector<float> all_k, all_v, all_q;
  std::vector<float> last(q_heads * head_dim);
  // One new token per step: append its key (rotated once, at its position) and
  // value, then attend over everything cached.
  posenc::kv_cache<float> cache(1, kv_heads, head_dim);
  for (index_t t = 0; t < steps; ++t) {
    auto q = posenc_test::random_vector<float>(q_heads * head_dim, 10 + t);
    auto k = posenc_test::random_vector<float>(kv_heads * head_dim, 20 + t);
    auto v = posenc_test::random_vector<float>(kv_heads * head_dim, 30 + t);
    all_q.insert(all_q.end(), q.begin(), q.end());
    all_k.insert(all_k.end(), k.begin(), k.end());
    all_v.insert(all_v.end(), v.begin(), v.end());
    std::vector<float> out(q_heads * head_dim);
    cache.append(posenc::make_bshd<const float>(k.data(), 1, 1, kv_heads, head_dim),
                 posenc::make_bshd<const float>(v.data(), 1, 1, kv_heads, head_dim), rope);
    posenc::attention_options<float> opt;
    opt.causal = true;  // rotation state and positions come from the cache
    posenc::attention(posenc::make_bshd<const float>(q.data(), 1, 1, q_heads, head_dim), cache,
                      posenc::make_bshd(out.data(), 1, 1, q_heads, head_dim), rope, opt);
    last = out;
  }
  // The last step equals the last row of one causal call over all tokens.
  std::vector<float> full(all_q.size());
  posenc::attention_options<float> opt;
  opt.causal = true;
  posenc::attention(posenc::make_bshd<const float>(all_q.data(), 1, steps, q_heads, head_dim),
                    posenc::make_bshd<const float>(all_k.data(), 1, steps, kv_heads, head_dim),
                    posenc::make_bshd<const float>(all_v.data(), 1, steps, kv_heads, head_dim),
                    posenc::make_bshd(full.data(), 1, steps, q_heads, head_dim), rope, opt);
  for (index_t n = 0; n < q_heads * head_dim; ++n)
    CHECK(last[static_cast<std::size_t>(n)] ==
          posenc_test::Approx(full[static_cast<std::size_t>((steps - 1) * q_heads * head_dim + n)]).margin(1e-5));
}

TEST_CASE("docs/attention.md: K and V stored in 16 bits", "[docs][half]") {
  index_t const n = 6, q_heads = 4, kv_heads = 2, head_dim = 8;
  auto qf = posenc_test::random_vector<float>(n * q_heads * head_dim, 1);
  auto kf = posenc_test::random_vector<float>(n * kv_heads * head_dim, 2);
  auto vf = posenc_test::random_vector<float>(n * kv_heads * head_dim, 3);
  std::vector<Eigen::half> k16(kf.begin(), kf.end()), v16(vf.begin(), vf.end());
  std::vector<float> o(qf.size());
  auto q = posenc::make_bshd<const float>(qf.data(), 1, n, q_heads, head_dim);
  auto out = posenc::make_bshd(o.data(), 1, n, q_heads, head_dim);
  posenc::rope<float> rope(posenc::rope_layout::half_split, head_dim);
  posenc::attention_options<float> opt;
  opt.causal = true;
  std::vector<Eigen::half> qh(qf.begin(), qf.end()), oh(qf.size());
  auto q16 = posenc::make_bshd<const Eigen::half>(qh.data(), 1, n, q_heads, head_dim);
  auto out16 = posenc::make_bshd(oh.data(), 1, n, q_heads, head_dim);
  posenc::view<const Eigen::half> k = posenc::make_bshd<const Eigen::half>(k16.data(), 1, n, kv_heads, head_dim);
  posenc::view<const Eigen::half> v = posenc::make_bshd<const Eigen::half>(v16.data(), 1, n, kv_heads, head_dim);
  posenc::attention(q, k, v, out, rope, opt);      // q, out: float views
  posenc::attention(q16, k, v, out16, rope, opt);  // q16, out16: Eigen::half views, opt: attention_options<float>
  for (float x : o) CHECK(std::isfinite(x));
  // q16 holds q rounded to binary16, so the two calls differ by about one
  // binary16 rounding of q and of the output.
  for (std::size_t i = 0; i < o.size(); ++i) {
    CHECK(std::isfinite(static_cast<float>(oh[i])));
    CHECK(static_cast<float>(oh[i]) == posenc_test::Approx(o[i]).margin(1e-2));
  }
}
}  // namespace attention_docs_tests
