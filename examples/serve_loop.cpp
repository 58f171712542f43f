// SPDX-License-Identifier: MIT
// A toy serving loop: packed prefill, batched decode over a paged KV cache, forks and frees, each output checked.
//
// A fixed-seed generator admits requests (random prompt lengths, random answer
// lengths) at random steps. Each step prefills the newly admitted prompts in
// one packed call and appends them to a paged_kv_cache, forks some prompts
// into several continuations (copy-on-write), decodes every live sequence in
// one batched call, frees the sequences that are done and compacts the pool
// when frees have scattered the live sequences' pages. A small random
// "model" makes the next token's q, k and v from the previous attention output,
// so that each decode step depends on the last. Every output is checked
// against plain posenc::attention on that sequence's own contiguous q/k/v
// history, under the tests' rule (error vs a double reference <= 2x the error
// of a plain float implementation + 1e-6).
//
//   posenc_example_serve_loop [--encoder rope|alibi] [--steps N] [--max-prompt N] [--page-tokens N]
//                             [--threads N] [--seed N]
#include <posenc/posenc.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// The plain float implementation of the tests' tolerance rule: the reference
// path accumulating in float instead of double.
struct plain_float_path {};

namespace posenc::detail {
template <>
struct kernel<plain_float_path> {
  static constexpr bool available = true;
  static constexpr bool provides_scores = true;
  static constexpr bool rotates_itself = false;
  template <class T, class E>
  static void run(attention_plan<T> const& p, view<const T> q, view<const T> k, view<const T> v, view<T> out,
                  E const& enc) {
    reference_attention<T>(p, q, k, v, out, enc);
  }
};
}  // namespace posenc::detail

namespace {

using posenc::index_t;
using clock_type = std::chrono::steady_clock;

struct settings {
  std::string encoder = "rope";
  index_t steps = 40, max_prompt = 96, page_tokens = 16;
  int threads = 1;
  unsigned seed = 2024;
};

// Model shape: 4 query heads over 2 key/value heads of 32 dims; width 64.
index_t const q_heads = 4, kv_heads = 2, head_dim = 32, width = 64, vocab = 512;

// Fixed random projections: token embeddings, x -> q, k, v, and attention output -> next x.
struct toy_model {
  std::vector<float> embed, wq, wk, wv, wo, sample_shift;
  explicit toy_model(unsigned seed) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto fill = [&](index_t n, float s) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (auto& e : x) e = s * normal(gen);
      return x;
    };
    float const s = 1.0f / std::sqrt(static_cast<float>(width));
    embed = fill(vocab * width, 1.0f);
    wq = fill(q_heads * head_dim * width, s);
    wk = fill(kv_heads * head_dim * width, s);
    wv = fill(kv_heads * head_dim * width, s);
    wo = fill(width * q_heads * head_dim, 1.0f / std::sqrt(static_cast<float>(q_heads * head_dim)));
    sample_shift = fill(width, 0.3f);
  }
  static void project(std::vector<float> const& w, index_t rows, float const* x, float* y) {
    for (index_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (index_t c = 0; c < width; ++c) acc += w[static_cast<std::size_t>(r * width + c)] * x[c];
      y[r] = acc;
    }
  }
  // q (Hq * D), k and v (Hkv * D) of a token whose input is x (width).
  void qkv(float const* x, float* q, float* k, float* v) const {
    project(wq, q_heads * head_dim, x, q);
    project(wk, kv_heads * head_dim, x, k);
    project(wv, kv_heads * head_dim, x, v);
  }
  // The next token's input: tanh(Wo . out) of the last attention output, moved
  // by `sample` x a fixed vector so that the continuations of a fork differ.
  void next_input(float const* out, index_t sample, float* x) const {
    for (index_t r = 0; r < width; ++r) {
      float acc = 0;
      for (index_t c = 0; c < q_heads * head_dim; ++c) acc += wo[static_cast<std::size_t>(r * q_heads * head_dim + c)] * out[c];
      x[r] = std::tanh(acc) + static_cast<float>(sample) * sample_shift[static_cast<std::size_t>(r)];
    }
  }
};

// One live sequence: its cache id and its contiguous q/k/v history (the check's input).
struct sequence {
  index_t id = 0, request = 0, sample = 0, left = 0;  // left: tokens still to decode
  std::vector<float> k, v;                            // (length, Hkv, D), unrotated
  std::vector<float> last_out;                        // (Hq, D): attention output of the last token
};

struct request {
  index_t prompt = 0, answer = 0, samples = 1, pages = 0;  // pages: worst case reserved in the pool
  std::vector<index_t> tokens;
};

// Checks `got` (Sq rows of (Hq, D)) against plain posenc::attention over the
// sequence's own contiguous history of `keys` keys: queries q (Sq, Hq, D) are
// its last Sq tokens. Returns false and prints what differs on a mismatch.
template <class EncF, class EncD>
bool check_rows(EncF const& enc_f, EncD const& enc_d, float const* q, index_t sq, float const* k, float const* v,
                index_t keys, float const* got, char const* what, index_t step, index_t request) {
  posenc::attention_options<float> of;
  of.causal = true;
  of.threads = 1;  // small calls: a thread team would cost more than the work
  posenc::attention_options<double> od;
  od.causal = true;
  od.threads = 1;
  std::size_t const nq = static_cast<std::size_t>(sq * q_heads * head_dim), nk = static_cast<std::size_t>(keys * kv_heads * head_dim);
  std::vector<double> qd(q, q + nq), kd(k, k + nk), vd(v, v + nk), ref(nq);
  std::vector<float> plain(nq);
  posenc::attention<posenc::path::reference>(posenc::make_bshd<const double>(qd.data(), 1, sq, q_heads, head_dim),
                                             posenc::make_bshd<const double>(kd.data(), 1, keys, kv_heads, head_dim),
                                             posenc::make_bshd<const double>(vd.data(), 1, keys, kv_heads, head_dim),
                                             posenc::make_bshd(ref.data(), 1, sq, q_heads, head_dim), enc_d, od);
  posenc::attention<plain_float_path>(posenc::make_bshd<const float>(q, 1, sq, q_heads, head_dim),
                                      posenc::make_bshd<const float>(k, 1, keys, kv_heads, head_dim),
                                      posenc::make_bshd<const float>(v, 1, keys, kv_heads, head_dim),
                                      posenc::make_bshd(plain.data(), 1, sq, q_heads, head_dim), enc_f, of);
  double err = 0, plain_err = 0, magnitude = 0;
  for (std::size_t i = 0; i < nq; ++i) {
    double const e = ref[i];
    err = std::isfinite(got[i]) ? std::max(err, std::abs(got[i] - e)) : INFINITY;
    plain_err = std::max(plain_err, std::abs(plain[i] - e));
    magnitude = std::max(magnitude, std::abs(e));
  }
  double const bound = 2 * plain_err + 1e-6 * std::max(1.0, magnitude);
  if (err <= bound) return true;
  std::fprintf(stderr,
               "serve_loop: MISMATCH in the %s of request %lld at step %lld (%lld keys): error %.3g vs the double "
               "reference, expected <= %.3g (2 x plain float error %.3g + 1e-6)\n",
               what, static_cast<long long>(request), static_cast<long long>(step), static_cast<long long>(keys), err,
               bound, plain_err);
  return false;
}

template <class EncF, class EncD>
int serve(settings const& cfg, EncF const& enc, EncD const& enc_d) {
  toy_model const model(cfg.seed);
  std::mt19937_64 gen(cfg.seed + 1);
  auto uniform = [&](index_t lo, index_t hi) { return std::uniform_int_distribution<index_t>(lo, hi)(gen); };
  index_t const P = cfg.page_tokens, max_answer = 48;
  auto pages_for = [&](index_t tokens) { return (tokens + P - 1) / P; };
  index_t const pool_pages = 24 * pages_for(cfg.max_prompt + max_answer);
  posenc::paged_kv_cache<float> cache(pool_pages, P, kv_heads, head_dim);
  posenc::paged_attention_workspace<float> ws;
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = cfg.threads;
  index_t const hq_d = q_heads * head_dim, hkv_d = kv_heads * head_dim;

  std::vector<sequence> live;
  std::vector<index_t> request_pages;  // pages reserved per request, released when its last sequence ends
  std::vector<index_t> request_live;   // live sequences per request
  index_t reserved = 0, admitted = 0, forks = 0, prefill_tokens = 0, decode_tokens = 0, checks = 0;
  double prefill_seconds = 0, decode_seconds = 0, compact_seconds = 0;
  index_t compactions = 0, pages_moved = 0;
  std::vector<float> x(static_cast<std::size_t>(width));

  for (index_t step = 0; step < cfg.steps || !live.empty(); ++step) {
    // 1. Admission: 0 to 3 requests while the worst case of each fits the pool.
    std::vector<request> fresh;
    index_t const arrivals = step < cfg.steps ? uniform(0, 3) - (step % 3 != 0) : 0;
    for (index_t a = 0; a < arrivals; ++a) {
      request r;
      r.prompt = uniform(1, cfg.max_prompt);
      r.answer = uniform(1, max_answer);
      r.samples = admitted % 4 == 0 ? 3 : 1;  // every fourth request samples 3 continuations
      // Worst case: the prompt's pages, then per continuation its answer and a copy of a shared tail page.
      r.pages = pages_for(r.prompt) + r.samples * (pages_for(r.answer) + 1);
      if (reserved + r.pages > pool_pages) break;
      for (index_t t = 0; t < r.prompt; ++t) r.tokens.push_back(uniform(0, vocab - 1));
      reserved += r.pages;
      request_pages.push_back(r.pages);
      request_live.push_back(r.samples);
      fresh.push_back(std::move(r));
      ++admitted;
    }

    // 2. Packed prefill of the new prompts: one call, then their keys and values into the cache.
    if (!fresh.empty()) {
      std::vector<index_t> lengths;
      for (request const& r : fresh) lengths.push_back(r.prompt);
      std::vector<index_t> const cu = posenc::cumulative_lengths(lengths);
      index_t const total = cu.back();
      std::vector<float> q(static_cast<std::size_t>(total * hq_d)), k(static_cast<std::size_t>(total * hkv_d)),
          v(k.size()), out(q.size());
      for (std::size_t s = 0; s < fresh.size(); ++s)
        for (index_t t = 0; t < fresh[s].prompt; ++t) {
          index_t const row = cu[s] + t;
          model.qkv(model.embed.data() + fresh[s].tokens[static_cast<std::size_t>(t)] * width, q.data() + row * hq_d,
                    k.data() + row * hkv_d, v.data() + row * hkv_d);
        }
      std::vector<index_t> ids;
      auto const t0 = clock_type::now();
      posenc::attention(posenc::make_bshd<const float>(q.data(), 1, total, q_heads, head_dim),
                        posenc::make_bshd<const float>(k.data(), 1, total, kv_heads, head_dim),
                        posenc::make_bshd<const float>(v.data(), 1, total, kv_heads, head_dim),
                        posenc::make_bshd(out.data(), 1, total, q_heads, head_dim), posenc::packed_sequences{cu, cu},
                        enc, opt);
      for (std::size_t s = 0; s < fresh.size(); ++s) {
        ids.push_back(cache.add_sequence());
        cache.append(ids.back(), posenc::make_bshd<const float>(k.data() + cu[s] * hkv_d, 1, fresh[s].prompt, kv_heads, head_dim),
                     posenc::make_bshd<const float>(v.data() + cu[s] * hkv_d, 1, fresh[s].prompt, kv_heads, head_dim),
                     enc);
      }
      prefill_seconds += std::chrono::duration<double>(clock_type::now() - t0).count();
      prefill_tokens += total;
      for (std::size_t s = 0; s < fresh.size(); ++s) {
        request const& r = fresh[s];
        index_t const req = admitted - static_cast<index_t>(fresh.size()) + static_cast<index_t>(s);
        float const* ks = k.data() + cu[s] * hkv_d;
        float const* vs = v.data() + cu[s] * hkv_d;
        if (!check_rows(enc, enc_d, q.data() + cu[s] * hq_d, r.prompt, ks, vs, r.prompt, out.data() + cu[s] * hq_d,
                        "packed prefill", step, req))
          return 1;
        ++checks;
        sequence seq;
        seq.id = ids[s];
        seq.request = req;
        seq.left = r.answer;
        seq.k.assign(ks, ks + r.prompt * hkv_d);
        seq.v.assign(vs, vs + r.prompt * hkv_d);
        seq.last_out.assign(out.data() + (cu[s + 1] - 1) * hq_d, out.data() + cu[s + 1] * hq_d);
        // A fork per extra continuation: it shares the prompt's pages until it appends.
        for (index_t c = 1; c < r.samples; ++c) {
          sequence f = seq;
          f.id = cache.fork(seq.id);
          f.sample = c;
          live.push_back(std::move(f));
          ++forks;
        }
        live.push_back(std::move(seq));
      }
    }
    if (live.empty()) continue;

    // 3. One batched decode step over every live sequence: next token's q, k, v from its last output.
    index_t const n = static_cast<index_t>(live.size());
    std::vector<index_t> ids(static_cast<std::size_t>(n));
    std::vector<float> q(static_cast<std::size_t>(n * hq_d)), k(static_cast<std::size_t>(n * hkv_d)), v(k.size()),
        out(q.size());
    for (index_t b = 0; b < n; ++b) {
      sequence const& s = live[static_cast<std::size_t>(b)];
      ids[static_cast<std::size_t>(b)] = s.id;
      model.next_input(s.last_out.data(), s.sample, x.data());
      model.qkv(x.data(), q.data() + b * hq_d, k.data() + b * hkv_d, v.data() + b * hkv_d);
    }
    auto const t0 = clock_type::now();
    cache.append(ids, posenc::make_bshd<const float>(k.data(), n, 1, kv_heads, head_dim),
                 posenc::make_bshd<const float>(v.data(), n, 1, kv_heads, head_dim), enc);
    posenc::attention(posenc::make_bshd<const float>(q.data(), n, 1, q_heads, head_dim), cache, ids,
                      posenc::make_bshd(out.data(), n, 1, q_heads, head_dim), enc, opt, ws);
    decode_seconds += std::chrono::duration<double>(clock_type::now() - t0).count();
    decode_tokens += n;
    for (index_t b = 0; b < n; ++b) {
      sequence& s = live[static_cast<std::size_t>(b)];
      s.k.insert(s.k.end(), k.begin() + b * hkv_d, k.begin() + (b + 1) * hkv_d);
      s.v.insert(s.v.end(), v.begin() + b * hkv_d, v.begin() + (b + 1) * hkv_d);
      index_t const keys = static_cast<index_t>(s.k.size()) / hkv_d;
      if (!check_rows(enc, enc_d, q.data() + b * hq_d, 1, s.k.data(), s.v.data(), keys, out.data() + b * hq_d,
                      "decode", step, s.request))
        return 1;
      ++checks;
      s.last_out.assign(out.begin() + b * hq_d, out.begin() + (b + 1) * hq_d);
      --s.left;
    }

    // 4. Free the finished sequences: their pages go back to the pool (shared ones when the last holder ends).
    for (std::size_t i = live.size(); i-- > 0;) {
      if (live[i].left > 0) continue;
      cache.free(live[i].id);
      std::size_t const req = static_cast<std::size_t>(live[i].request);
      if (--request_live[req] == 0) reserved -= request_pages[req];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }

    // 5. Frees scatter the pool: when the live sequences' pages form more than
    // twice as many runs as there are sequences, move them back into runs (the
    // attention reads each run as one stream; later steps check that no key moved wrongly).
    index_t runs = 0;
    for (sequence const& s : live) runs += cache.page_runs(s.id);
    if (runs > 2 * static_cast<index_t>(live.size())) {
      auto const c0 = clock_type::now();
      index_t const moved = cache.compact();
      compact_seconds += std::chrono::duration<double>(clock_type::now() - c0).count();
      ++compactions;
      pages_moved += moved;
    }
    if (step % 8 == 0 || live.empty())
      std::printf("step %3lld: %2lld live sequences, pool %4lld / %lld pages in use\n", static_cast<long long>(step),
                  static_cast<long long>(live.size()), static_cast<long long>(cache.pages() - cache.free_page_count()),
                  static_cast<long long>(cache.pages()));
  }

  if (cache.free_page_count() != cache.pages()) {
    std::fprintf(stderr, "serve_loop: %lld pages still in use after every sequence was freed, expected 0\n",
                 static_cast<long long>(cache.pages() - cache.free_page_count()));
    return 1;
  }
  std::printf("%lld requests (%lld forked continuations), %lld outputs checked against each sequence alone: ok\n",
              static_cast<long long>(admitted), static_cast<long long>(forks), static_cast<long long>(checks));
  std::printf("prefill: %lld tokens, %.0f tokens/s (packed attention + cache append)\n",
              static_cast<long long>(prefill_tokens), static_cast<double>(prefill_tokens) / std::max(prefill_seconds, 1e-9));
  std::printf("decode:  %lld tokens, %.0f tokens/s (cache append + batched paged attention)\n",
              static_cast<long long>(decode_tokens), static_cast<double>(decode_tokens) / std::max(decode_seconds, 1e-9));
  std::printf("compact: %lld times, %lld pages moved, %.3f ms in all\n", static_cast<long long>(compactions),
              static_cast<long long>(pages_moved), 1e3 * compact_seconds);
  return 0;
}

bool parse(int argc, char** argv, settings& cfg) {
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    bool const has_value = i + 1 < argc;
    if (a == "--encoder" && has_value) {
      cfg.encoder = argv[++i];
      if (cfg.encoder != "rope" && cfg.encoder != "alibi") return false;
    } else if ((a == "--steps" || a == "--max-prompt" || a == "--page-tokens" || a == "--threads" || a == "--seed") &&
               has_value) {
      long long const value = std::atoll(argv[++i]);
      if (value < 1 || value > 1000000) return false;
      if (a == "--steps") cfg.steps = value;
      if (a == "--max-prompt") cfg.max_prompt = value;
      if (a == "--page-tokens") cfg.page_tokens = value;
      if (a == "--threads") cfg.threads = static_cast<int>(value);
      if (a == "--seed") cfg.seed = static_cast<unsigned>(value);
    } else {
      return false;
    }
  }
  return cfg.page_tokens <= posenc::paged_kv_cache<float>::max_page_tokens;
}

}  // namespace

int main(int argc, char** argv) {
  settings cfg;
  if (!parse(argc, argv, cfg)) {
    std::fprintf(stderr,
                 "usage: %s [--encoder rope|alibi] [--steps N] [--max-prompt N] [--page-tokens N] [--threads N] "
                 "[--seed N]\n",
                 argv[0]);
    return 2;
  }
  std::printf("serve_loop: %s, %lld admission steps, prompts of 1 to %lld tokens, %lld-token pages, %d thread(s)\n",
              cfg.encoder.c_str(), static_cast<long long>(cfg.steps), static_cast<long long>(cfg.max_prompt),
              static_cast<long long>(cfg.page_tokens), cfg.threads);
  try {
    if (cfg.encoder == "alibi")
      return serve(cfg, posenc::alibi<float>(posenc::alibi_form::paper, q_heads),
                   posenc::alibi<double>(posenc::alibi_form::paper, q_heads));
    posenc::rope<float> rope(posenc::rope_layout::half_split, head_dim);
    rope.reserve(cfg.max_prompt + 64);  // the kernels rotate the queries in place up to this length
    return serve(cfg, rope, posenc::rope<double>(posenc::rope_layout::half_split, head_dim));
  } catch (posenc::error const& e) {
    std::fprintf(stderr, "serve_loop: %s\n", e.what());
    return 1;
  }
}
