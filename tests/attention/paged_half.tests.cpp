// SPDX-License-Identifier: MIT
// paged_kv_cache<Eigen::half> and paged_kv_cache<Eigen::bfloat16>: storage rounded once, forks, errors, and
// attention over 16-bit pages equal to the contiguous 16-bit cache and to the reference on the widened values.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/paged_attention.hpp>
#include <posenc/attention/paged_kv_cache.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/kernel_choice.hpp"
#include "support/random.hpp"
#include "support/tolerance.hpp"
#include "support/transformer_xl.hpp"

namespace attention_paged_half_tests {

using posenc::index_t;
using posenc_test::random_vector;

namespace {

constexpr index_t W = posenc::simd::width<float>;
index_t const Hq = 4, Hkv = 2, D = 2 * W + 2, Dv = W + 3;

/// One 16-bit ulp at 1 for S: 2^-10 (binary16), 2^-7 (bfloat16).
template <class S>
constexpr double epsilon16_v = std::is_same_v<S, Eigen::bfloat16> ? 1.0 / 128 : 1.0 / 1024;

template <class S>
std::uint16_t bits(S x) {
  return Eigen::numext::bit_cast<std::uint16_t>(x);
}

// Keys, values and queries of one sequence (float), rows (len, heads, dim).
struct tokens {
  std::vector<float> k, v, q;
  tokens(index_t len, std::uint64_t seed)
      : k(random_vector<float>(static_cast<std::size_t>(len * Hkv * D), seed, -2, 2)),
        v(random_vector<float>(static_cast<std::size_t>(len * Hkv * Dv), seed + 1)),
        q(random_vector<float>(static_cast<std::size_t>(len * Hq * D), seed + 2, -2, 2)) {}
  posenc::view<const float> keys(index_t s, index_t n) const { return part(k, s, n, Hkv, D); }
  posenc::view<const float> values(index_t s, index_t n) const { return part(v, s, n, Hkv, Dv); }
  static posenc::view<const float> part(std::vector<float> const& x, index_t s, index_t n, index_t h, index_t d) {
    return posenc::make_bshd(x.data() + s * h * d, 1, n, h, d);
  }
};

template <class F>
void for_each_encoder(F&& f) {
  f("none", posenc::none{});
  f("rope", posenc::rope<float>(posenc::rope_layout::half_split, D));
  f("alibi", posenc::alibi<float>(posenc::alibi_form::paper, Hq));
}

/// Three sequences of different lengths (first positions 0, 5, 0) appended in
/// interleaved steps (their pages alternate), then sequence 3 forked from 0
/// and both continued differently; beside them, one contiguous kv_cache<S>
/// and one paged_kv_cache<float> per sequence, fed the same appends.
template <class S>
struct scene {
  static constexpr index_t n_seq = 4;
  posenc::paged_kv_cache<S> paged;
  posenc::paged_kv_cache<float> wide;  // the same appends in float (keys rotated in float)
  std::vector<posenc::kv_cache<S>> flat;
  std::vector<tokens> toks;
  std::vector<index_t> ids, wide_ids, used;  // used: tokens of toks[s] consumed

  template <class E>
  scene(index_t page, E const& enc)
      : paged(64, page, Hkv, D, Dv), wide(64, page, Hkv, D, Dv) {
    index_t const firsts[3] = {0, 5, 0};
    for (index_t s = 0; s < n_seq; ++s) toks.emplace_back(160, 100 + 10 * static_cast<std::uint64_t>(s));
    used.assign(n_seq, 0);
    for (index_t s = 0; s < 3; ++s) {
      ids.push_back(paged.add_sequence(firsts[s]));
      wide_ids.push_back(wide.add_sequence(firsts[s]));
      flat.emplace_back(index_t(1), Hkv, D, Dv, firsts[s]);
    }
    // Interleaved appends of 7, 3 and 11 tokens, four rounds: lengths 28, 12, 44.
    index_t const step[3] = {7, 3, 11};
    for (int round = 0; round < 4; ++round)
      for (index_t s = 0; s < 3; ++s) append(s, s, step[s], enc);
    // A batched append of 2 tokens to sequences 0 and 2 at once (k and v of 2 entries).
    append_batched(enc);
    // Fork 0 -> 3 (the fork's tokens start from sequence 0's); both continue.
    ids.push_back(paged.fork(ids[0]));
    wide_ids.push_back(wide.fork(wide_ids[0]));
    flat.push_back(flat[0]);
    toks[3] = toks[0];
    used[3] = used[0];
    toks[3].k = random_vector<float>(toks[3].k.size(), 999, -2, 2);  // a different continuation
    toks[3].v = random_vector<float>(toks[3].v.size(), 998);
    append(0, 0, 9, enc);
    append(3, 3, 21, enc);
  }
  // Appends the next n tokens of toks[s] to sequence s in all three caches.
  template <class E>
  void append(index_t s, index_t, index_t n, E const& enc) {
    tokens const& t = toks[static_cast<std::size_t>(s)];
    index_t const u = used[static_cast<std::size_t>(s)];
    paged.append(ids[static_cast<std::size_t>(s)], t.keys(u, n), t.values(u, n), enc);
    wide.append(wide_ids[static_cast<std::size_t>(s)], t.keys(u, n), t.values(u, n), enc);
    flat[static_cast<std::size_t>(s)].append(t.keys(u, n), t.values(u, n), enc);
    used[static_cast<std::size_t>(s)] += n;
  }
  template <class E>
  void append_batched(E const& enc) {
    index_t const n = 2;
    std::vector<float> k(static_cast<std::size_t>(2 * n * Hkv * D)), v(static_cast<std::size_t>(2 * n * Hkv * Dv));
    index_t const which[2] = {0, 2};
    for (index_t b = 0; b < 2; ++b) {
      tokens const& t = toks[static_cast<std::size_t>(which[b])];
      index_t const u = used[static_cast<std::size_t>(which[b])];
      std::copy_n(t.k.begin() + u * Hkv * D, n * Hkv * D, k.begin() + b * n * Hkv * D);
      std::copy_n(t.v.begin() + u * Hkv * Dv, n * Hkv * Dv, v.begin() + b * n * Hkv * Dv);
    }
    auto const kv = posenc::make_bshd(static_cast<float const*>(k.data()), 2, n, Hkv, D);
    auto const vv = posenc::make_bshd(static_cast<float const*>(v.data()), 2, n, Hkv, Dv);
    index_t const pid[2] = {ids[0], ids[2]}, wid[2] = {wide_ids[0], wide_ids[2]};
    paged.append(posenc::span<const index_t>(pid, 2), kv, vv, enc);
    wide.append(posenc::span<const index_t>(wid, 2), kv, vv, enc);
    for (index_t b = 0; b < 2; ++b) {
      index_t const s = which[b];
      tokens const& t = toks[static_cast<std::size_t>(s)];
      flat[static_cast<std::size_t>(s)].append(t.keys(used[static_cast<std::size_t>(s)], n),
                                               t.values(used[static_cast<std::size_t>(s)], n), enc);
      used[static_cast<std::size_t>(s)] += n;
    }
  }
};

/// Key (or value) element (t, h, d) of sequence id, read through the page table.
template <class T>
T stored(posenc::paged_kv_cache<T> const& c, index_t id, bool values, index_t t, index_t h, index_t d) {
  index_t const page = c.page_table(id)[t / c.page_tokens()];
  posenc::view<const T> const x = values ? c.page_values(page, 1) : c.page_keys(page, 1);
  return x(0, t % c.page_tokens(), h, d);
}

/// Property 1: every stored key and value is the float one (keys rotated in
/// float) rounded once; the contiguous 16-bit cache holds the same bits.
template <class S>
bool stored_rounded_once(scene<S> const& sc) {
  bool ok = true;
  for (index_t s = 0; s < scene<S>::n_seq; ++s) {
    index_t const id = sc.ids[static_cast<std::size_t>(s)], wid = sc.wide_ids[static_cast<std::size_t>(s)];
    posenc::kv_cache<S> const& f = sc.flat[static_cast<std::size_t>(s)];
    ok = ok && sc.paged.length(id) == f.length() && sc.paged.next_position(id) == f.next_position();
    for (index_t t = 0; t < sc.paged.length(id); ++t)
      for (index_t h = 0; h < Hkv; ++h) {
        for (index_t d = 0; d < D; ++d) {
          S const got = stored(sc.paged, id, false, t, h, d);
          ok = ok && bits(got) == bits(posenc::detail::to_storage<S>(stored(sc.wide, wid, false, t, h, d)));
          ok = ok && bits(got) == bits(f.keys()(0, t, h, d));
        }
        for (index_t d = 0; d < Dv; ++d) {
          S const got = stored(sc.paged, id, true, t, h, d);
          ok = ok && bits(got) == bits(posenc::detail::to_storage<S>(stored(sc.wide, wid, true, t, h, d)));
          ok = ok && bits(got) == bits(f.values()(0, t, h, d));
        }
      }
  }
  return ok;
}

/// The query entries of a call: sequence s's entry has Sq queries from toks[s].q.
template <class QS>
std::vector<QS> make_queries(std::vector<tokens> const& toks, index_t Sq) {
  std::vector<QS> q(static_cast<std::size_t>(static_cast<index_t>(toks.size()) * Sq * Hq * D));
  for (std::size_t s = 0; s < toks.size(); ++s)
    for (index_t n = 0; n < Sq * Hq * D; ++n)
      q[s * static_cast<std::size_t>(Sq * Hq * D) + static_cast<std::size_t>(n)] =
          posenc::detail::to_storage<QS>(toks[s].q[static_cast<std::size_t>(n)]);
  return q;
}

template <class QS>
std::vector<float> widened(std::vector<QS> const& x) {
  std::vector<float> r(x.size());
  for (std::size_t n = 0; n < x.size(); ++n) r[n] = posenc::detail::stored_value<float>(x[n]);
  return r;
}

/// The paged call over every sequence with Sq queries each (q and out of QS).
template <class Path, class QS, class S, class E>
std::vector<float> run_paged(scene<S> const& sc, std::vector<QS> const& q, index_t Sq, E const& enc,
                             posenc::attention_options<float> const& opt) {
  index_t const n = scene<S>::n_seq;
  std::vector<QS> out(static_cast<std::size_t>(n * Sq * Hq * Dv), posenc::detail::to_storage<QS>(-7.0f));
  posenc::attention<Path>(posenc::make_bshd(q.data(), n, Sq, Hq, D), sc.paged,
                          posenc::span<const index_t>(sc.ids.data(), n), posenc::make_bshd(out.data(), n, Sq, Hq, Dv),
                          enc, opt);
  return widened(out);
}

/// Each sequence alone over its contiguous kv_cache<S> on Path (q and out of QS).
template <class Path = posenc::path::fused, class QS, class S, class E>
std::vector<float> run_flat(scene<S> const& sc, std::vector<QS> const& q, index_t Sq, E const& enc,
                            posenc::attention_options<float> const& opt) {
  index_t const n = scene<S>::n_seq;
  std::vector<QS> out(static_cast<std::size_t>(n * Sq * Hq * Dv), posenc::detail::to_storage<QS>(-7.0f));
  for (index_t s = 0; s < n; ++s)
    posenc::attention<Path>(posenc::make_bshd(q.data() + s * Sq * Hq * D, 1, Sq, Hq, D),
                                           sc.flat[static_cast<std::size_t>(s)],
                                           posenc::make_bshd(out.data() + s * Sq * Hq * Dv, 1, Sq, Hq, Dv), enc, opt);
  return widened(out);
}

/// Each sequence alone on float views of its widened cached keys and values
/// (keys as cached: rotated when stored rotated), with Path (the double
/// reference, or the plain float implementation of the tolerance rule).
template <class Path, class S, class E>
std::vector<float> run_widened(scene<S> const& sc, std::vector<float> const& q, index_t Sq, E const& enc,
                               posenc::attention_options<float> const& opt) {
  index_t const n = scene<S>::n_seq;
  std::vector<float> out(static_cast<std::size_t>(n * Sq * Hq * Dv), -7.0f);
  for (index_t s = 0; s < n; ++s) {
    index_t const id = sc.ids[static_cast<std::size_t>(s)], L = sc.paged.length(id);
    std::vector<float> k(static_cast<std::size_t>(L * Hkv * D)), v(static_cast<std::size_t>(L * Hkv * Dv));
    for (index_t t = 0; t < L; ++t)
      for (index_t h = 0; h < Hkv; ++h) {
        for (index_t d = 0; d < D; ++d)
          k[static_cast<std::size_t>((t * Hkv + h) * D + d)] =
              posenc::detail::stored_value<float>(stored(sc.paged, id, false, t, h, d));
        for (index_t d = 0; d < Dv; ++d)
          v[static_cast<std::size_t>((t * Hkv + h) * Dv + d)] =
              posenc::detail::stored_value<float>(stored(sc.paged, id, true, t, h, d));
      }
    posenc::attention_options<float> o = opt;
    o.keys_rotated = sc.paged.keys_rotated();
    o.k_positions = posenc::position_span(sc.paged.first_position(id));
    o.q_positions = posenc::position_span(sc.paged.next_position(id) - Sq);
    posenc::attention<Path>(posenc::make_bshd(q.data() + s * Sq * Hq * D, 1, Sq, Hq, D),
                            posenc::make_bshd(static_cast<float const*>(k.data()), 1, L, Hkv, D),
                            posenc::make_bshd(static_cast<float const*>(v.data()), 1, L, Hkv, Dv),
                            posenc::make_bshd(out.data() + s * Sq * Hq * Dv, 1, Sq, Hq, Dv), enc, o);
  }
  return out;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  bool ok = a.size() == b.size();
  for (std::size_t n = 0; ok && n < a.size(); ++n) ok = a[n] == b[n] || (std::isnan(a[n]) && std::isnan(b[n]));
  return ok;
}

/// Every check of one (S, page size, encoder, options, query count), for
/// float q and out and for all-16-bit q and out:
/// 2. paged fused == each sequence alone over its contiguous kv_cache<S> (fused),
///    bit for bit where the order of operations is the same (one thread: the
///    decode row kernel walks the same tiles), else by the tolerance rule;
/// 3. paged fused and paged reference vs the double reference on the widened
///    values: within 2x the plain float implementation's error + one 16-bit
///    ulp of the output (all-16-bit: the plain output rounded once);
/// 4. paged reference == the double reference on the widened values, rounded
///    to the output type (the same computation).
/// `sixteen` false: float q and out only (an encoder checked with fewer instantiations).
template <class S, class E>
void check_attention(scene<S> const& sc, E const& enc, posenc::attention_options<float> const& opt, index_t Sq,
                     bool exact, std::string const& what, bool sixteen = true) {
  double const eps = epsilon16_v<S>;
  // float q and out
  std::vector<float> const qf = make_queries<float>(sc.toks, Sq);
  std::vector<float> const fused = run_paged<posenc::path::fused>(sc, qf, Sq, enc, opt);
  std::vector<float> const best = run_paged<posenc::path::best>(sc, qf, Sq, enc, opt);
  std::vector<float> const refp = run_paged<posenc::path::reference>(sc, qf, Sq, enc, opt);
  std::vector<float> const flat = run_flat(sc, qf, Sq, enc, opt);
  std::vector<float> const ref = run_widened<posenc::path::reference>(sc, qf, Sq, enc, opt);
  std::vector<float> const plain = run_widened<posenc_test::plain_path>(sc, qf, Sq, enc, opt);
  INFO(what << " (float q and out)");
  CHECK(same_bits(fused, best));
  if (exact) {
    CHECK(same_bits(fused, flat));
  } else {
    auto const r = posenc_test::within_tolerance(fused, ref, plain, 1e-6);
    auto const rf = posenc_test::within_tolerance(flat, ref, plain, 1e-6);
    INFO("paged " << r.describe() << "; contiguous " << rf.describe());
    CHECK(r.ok);
    CHECK(rf.ok);
  }
  auto const rep = posenc_test::within_tolerance(fused, ref, plain, eps);
  INFO("paged fused vs reference on the widened values: " << rep.describe());
  CHECK(rep.ok);
  CHECK(same_bits(refp, ref));
  if (!sixteen) return;

  // all-16-bit q and out: q rounded to S, the reference on its float values.
  std::vector<S> const qh = make_queries<S>(sc.toks, Sq);
  std::vector<float> const qw = widened(qh);
  std::vector<float> const f16 = run_paged<posenc::path::fused>(sc, qh, Sq, enc, opt);
  std::vector<float> const r16 = run_paged<posenc::path::reference>(sc, qh, Sq, enc, opt);
  std::vector<float> const flat16 = run_flat(sc, qh, Sq, enc, opt);
  std::vector<float> const ref16 = run_widened<posenc::path::reference>(sc, qw, Sq, enc, opt);
  std::vector<float> plain16 = run_widened<posenc_test::plain_path>(sc, qw, Sq, enc, opt);
  for (float& x : plain16) x = posenc::detail::stored_value<float>(posenc::detail::to_storage<S>(x));
  // The reference rounds its double result once to S (not its float result):
  // the paged reference is the contiguous reference over the same 16-bit cache.
  std::vector<float> const flat16_ref = run_flat<posenc::path::reference>(sc, qh, Sq, enc, opt);
  INFO(what << " (all-16-bit q and out)");
  if (exact) CHECK(same_bits(f16, flat16));
  auto const rep16 = posenc_test::within_tolerance(f16, ref16, plain16, eps);
  auto const rep16r = posenc_test::within_tolerance(r16, ref16, plain16, eps);
  INFO("paged fused: " << rep16.describe() << "; paged reference: " << rep16r.describe());
  CHECK(rep16.ok);
  CHECK(rep16r.ok);
  CHECK(same_bits(r16, flat16_ref));
}

/// check_attention for decodes, a few queries and a prefill chunk of
/// `prefill` queries (at least W / 2: with 2 query heads per kv head, rows
/// enough for the lane kernel), causal or not, on one and two threads.
template <class S, class E>
void check_calls(scene<S> const& sc, E const& enc, index_t page, std::string const& base, bool sixteen = true,
                 index_t prefill = W) {
  for (bool causal : {false, true}) {
    posenc::attention_options<float> opt;
    opt.causal = causal;
    opt.threads = 1;
    std::string const what = base + (causal ? " causal" : " not causal");
    // Below a SIMD width of query rows per kv head both calls run the row kernel, which walks
    // the same steps over pages as over the contiguous cache: the same bits. From there the
    // lane kernel lays its key tiles from each run of consecutive pages: the same tiles as over
    // the contiguous cache when pages hold whole tiles (and the same results bit for bit), else
    // other tiles. With Shaw-like score terms (Transformer-XL) the paged call runs the row
    // kernel, the contiguous one the lane kernel over distance columns. Which calls are which
    // depends on the SIMD width (support/kernel_choice.hpp): 3 queries of 2 heads per kv head
    // run the lane kernel with 4 float lanes (SSE2, NEON).
    bool const whole_tiles = page % posenc::detail::fused_default_traits<float>::block_kv_v == 0;
    bool const lanes = !posenc::encoder_traits<E>::relative_key_value;
    auto const exact = [&](index_t sq) {
      return posenc_test::paged_row_kernel<float, S>(sq * (Hq / Hkv)) || (whole_tiles && lanes);
    };
    check_attention(sc, enc, opt, 1, exact(1), what + " decode, 1 thread", sixteen);
    check_attention(sc, enc, opt, 3, exact(3), what + " 3 queries, 1 thread", sixteen);
    check_attention(sc, enc, opt, prefill, exact(prefill), what + " prefill chunk", sixteen);
    opt.threads = 2;
    check_attention(sc, enc, opt, 1, false, what + " decode, 2 threads", sixteen);
  }
}

template <class S>
void check_all(char const* format) {
  for (index_t page : {index_t(16), index_t(64)})
    for_each_encoder([&](char const* name, auto const& enc) {
      scene<S> const sc(page, enc);
      std::string const base = std::string(format) + " page " + std::to_string(page) + " " + name;
      INFO(base);
      CHECK(stored_rounded_once(sc));
      check_calls(sc, enc, page, base);
    });
}

}  // namespace

TEST_CASE("paged_kv_cache<half>: stored values rounded once, attention equals the contiguous 16-bit cache",
          "[paged][half]") {
  check_all<Eigen::half>("binary16");
}

TEST_CASE("paged_kv_cache<bfloat16>: stored values rounded once, attention equals the contiguous 16-bit cache",
          "[paged][half]") {
  check_all<Eigen::bfloat16>("bfloat16");
}

namespace {

/// Keys and values of sequence id, as stored (bits), read through its page table.
template <class S>
std::vector<std::uint16_t> snapshot(posenc::paged_kv_cache<S> const& c, index_t id) {
  std::vector<std::uint16_t> r;
  for (index_t t = 0; t < c.length(id); ++t)
    for (index_t h = 0; h < Hkv; ++h) {
      for (index_t d = 0; d < D; ++d) r.push_back(bits(stored(c, id, false, t, h, d)));
      for (index_t d = 0; d < Dv; ++d) r.push_back(bits(stored(c, id, true, t, h, d)));
    }
  return r;
}

template <class S>
void check_fork(char const* format) {
  INFO(format);
  posenc::rope<float> const rope(posenc::rope_layout::interleaved, D);
  tokens const t(64, 7), u(64, 8);
  posenc::paged_kv_cache<S> c(16, 16, Hkv, D, Dv);
  index_t const a = c.add_sequence();
  c.append(a, t.keys(0, 21), t.values(0, 21), rope);  // one full page and 5 tokens of a second
  index_t const b = c.fork(a);
  std::vector<std::uint16_t> const before_a = snapshot(c, a), before_b = snapshot(c, b);
  CHECK(before_a == before_b);
  for (index_t p : c.page_table(a)) CHECK(c.page_references(p) == 2);
  // Appends to the fork copy its shared, partly filled last page: a keeps its keys.
  c.append(b, u.keys(0, 14), u.values(0, 14), rope);
  CHECK(snapshot(c, a) == before_a);
  CHECK(c.page_table(a)[0] == c.page_table(b)[0]);  // the full page stays shared
  CHECK(c.page_table(a)[1] != c.page_table(b)[1]);
  std::vector<std::uint16_t> const b_now = snapshot(c, b);
  CHECK(std::vector<std::uint16_t>(b_now.begin(), b_now.begin() + static_cast<std::ptrdiff_t>(before_b.size())) ==
        before_b);
  // And appends to the original never reach the fork.
  c.append(a, t.keys(21, 30), t.values(21, 30), rope);
  CHECK(snapshot(c, b) == b_now);
  std::vector<std::uint16_t> const a_now = snapshot(c, a);
  CHECK(std::vector<std::uint16_t>(a_now.begin(), a_now.begin() + static_cast<std::ptrdiff_t>(before_a.size())) ==
        before_a);
  c.free(a);
  CHECK(snapshot(c, b) == b_now);
  c.free(b);
  CHECK(c.free_page_count() == c.pages());
}

template <class S>
void check_half_views(char const* format) {
  INFO(format);
  // k and v given as S: stored as they are (unrotated), or widened, rotated in
  // float and rounded once: the same bits as the float append of their values.
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  tokens const t(40, 21);
  std::vector<S> kh(t.k.size()), vh(t.v.size());
  std::vector<float> kw(t.k.size()), vw(t.v.size());
  for (std::size_t n = 0; n < kh.size(); ++n) {
    kh[n] = posenc::detail::to_storage<S>(t.k[n]);
    kw[n] = posenc::detail::stored_value<float>(kh[n]);
  }
  for (std::size_t n = 0; n < vh.size(); ++n) {
    vh[n] = posenc::detail::to_storage<S>(t.v[n]);
    vw[n] = posenc::detail::stored_value<float>(vh[n]);
  }
  auto half_part = [](std::vector<S> const& x, index_t s, index_t n, index_t d) {
    return posenc::make_bshd(x.data() + s * Hkv * d, 1, n, Hkv, d);
  };
  auto check = [&](auto const& enc, char const* name) {
    INFO(name);
    posenc::paged_kv_cache<S> from16(8, 16, Hkv, D, Dv), from32(8, 16, Hkv, D, Dv);
    index_t const a = from16.add_sequence(3), b = from32.add_sequence(3);
    for (index_t s0 : {index_t(0), index_t(13), index_t(30)}) {
      index_t const n = s0 == 30 ? 10 : 13 + (s0 == 13 ? 4 : 0);
      from16.append(a, half_part(kh, s0, n, D), half_part(vh, s0, n, Dv), enc);
      from32.append(b, tokens::part(kw, s0, n, Hkv, D), tokens::part(vw, s0, n, Hkv, Dv), enc);
    }
    CHECK(from16.length(a) == 40);
    CHECK(snapshot(from16, a) == snapshot(from32, b));
    if (!posenc::encoder_traits<std::decay_t<decltype(enc)>>::rotates_queries_keys) {
      bool same = true;
      for (index_t s = 0; s < 40; ++s)
        for (index_t h = 0; h < Hkv; ++h)
          for (index_t d = 0; d < D; ++d)
            same = same && bits(stored(from16, a, false, s, h, d)) == bits(kh[static_cast<std::size_t>((s * Hkv + h) * D + d)]);
      CHECK(same);
    }
  };
  check(posenc::none{}, "none");
  check(rope, "rope");
}

template <class S>
void check_errors(char const* format) {
  INFO(format);
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  tokens const t(64, 31);
  posenc::paged_kv_cache<S> c(3, 16, Hkv, D, Dv);
  index_t const a = c.add_sequence(), b = c.add_sequence();
  c.append(a, t.keys(0, 20), t.values(0, 20), rope);  // 2 pages
  std::vector<std::uint16_t> const before = snapshot(c, a);
  // Out of pages: 20 tokens need 2 pages, 1 is free; nothing changes.
  REQUIRE_THROWS_WITH(c.append(b, t.keys(20, 20), t.values(20, 20), rope),
                      posenc_test::contains("pages needed is 2, expected <= 1"));
  CHECK(c.length(b) == 0);
  CHECK(c.free_page_count() == 1);
  CHECK(snapshot(c, a) == before);
  // A fork's append that needs a copy of the shared last page and one more page.
  index_t const f = c.fork(a);
  REQUIRE_THROWS_WITH(c.append(f, t.keys(20, 13), t.values(20, 13), rope),
                      posenc_test::contains("pages needed is 2, expected <= 1"));
  CHECK(c.length(f) == 20);
  CHECK(snapshot(c, a) == before);
  CHECK(snapshot(c, f) == before);
  // From 16-bit views too.
  std::vector<S> kh(static_cast<std::size_t>(40 * Hkv * D)), vh(static_cast<std::size_t>(40 * Hkv * Dv));
  REQUIRE_THROWS_WITH(c.append(b, posenc::make_bshd(static_cast<S const*>(kh.data()), 1, 40, Hkv, D),
                               posenc::make_bshd(static_cast<S const*>(vh.data()), 1, 40, Hkv, Dv), rope),
                      posenc_test::contains("pages needed is 3, expected <= 1"));
  CHECK(c.length(b) == 0);
  // Shapes and encoders as for a float cache.
  REQUIRE_THROWS_WITH(c.append(b, t.keys(0, 2), t.values(0, 1), rope), posenc_test::contains("v.seq is 1, expected 2"));
  REQUIRE_THROWS_WITH(c.append(b, t.keys(0, 2), t.values(0, 2), posenc::none{}),
                      posenc_test::contains("rotates_queries_keys is false, expected true"));
  // Attention: bad arguments throw before out is written (float and 16-bit out).
  std::vector<float> q = random_vector<float>(static_cast<std::size_t>(2 * Hq * D), 5);
  std::vector<float> out(static_cast<std::size_t>(2 * Hq * Dv), 42.0f);
  std::vector<S> q16(q.size()), out16(out.size(), posenc::detail::to_storage<S>(42.0f));
  std::vector<index_t> ids = {a, f};
  auto qv = posenc::make_bshd(static_cast<float const*>(q.data()), 2, 1, Hq, D);
  auto ov = posenc::make_bshd(out.data(), 2, 1, Hq, Dv);
  auto qv16 = posenc::make_bshd(static_cast<S const*>(q16.data()), 2, 1, Hq, D);
  auto ov16 = posenc::make_bshd(out16.data(), 2, 1, Hq, Dv);
  REQUIRE_THROWS_WITH(posenc::attention(qv, c, ids, ov, posenc::none{}),
                      posenc_test::contains("rotates_queries_keys is false, expected true"));
  REQUIRE_THROWS_WITH(posenc::attention<posenc::path::reference>(qv16, c, ids, ov16, posenc::none{}),
                      posenc_test::contains("rotates_queries_keys is false, expected true"));
  std::vector<index_t> const bad = {a, 9};
  REQUIRE_THROWS_WITH(posenc::attention(qv, c, bad, ov, rope),
                      posenc_test::contains("seq_ids[1] is 9, expected the id of an open sequence"));
  auto qshort = posenc::make_bshd(static_cast<float const*>(q.data()), 2, 1, Hq, D - 2);
  REQUIRE_THROWS_WITH(posenc::attention(qshort, c, ids, ov, posenc::rope<float>(posenc::rope_layout::half_split, D - 2)),
                      posenc_test::contains("q.dim is " + std::to_string(D - 2)));
  posenc::attention_options<float> opt;
  opt.scores = q;
  REQUIRE_THROWS_WITH(posenc::attention(qv16, c, ids, ov16, rope, opt), posenc_test::contains("scores is set, expected null"));
  for (float x : out) CHECK(x == 42.0f);
  for (S x : out16) CHECK(bits(x) == bits(posenc::detail::to_storage<S>(42.0f)));
}

}  // namespace

TEST_CASE("paged_kv_cache<half> and <bfloat16>: an append to one fork never changes the other's keys",
          "[paged][half]") {
  check_fork<Eigen::half>("binary16");
  check_fork<Eigen::bfloat16>("bfloat16");
}

TEST_CASE("paged_kv_cache<half> and <bfloat16>: appends from 16-bit views equal appends of their float values",
          "[paged][half]") {
  check_half_views<Eigen::half>("binary16");
  check_half_views<Eigen::bfloat16>("bfloat16");
}

TEST_CASE("paged_kv_cache<half> and <bfloat16>: errors as for float caches, nothing changed or written",
          "[paged][half][errors]") {
  check_errors<Eigen::half>("binary16");
  check_errors<Eigen::bfloat16>("bfloat16");
}

namespace {

/// Transformer-XL (its memory kept whole, and cut to the last 9 keys) and the
/// T5, clipped and Shaw encoders with S tables, over S pages (appended with
/// none), with float q and out and with all-16-bit q and out: the checks of
/// check_attention, among them the paged fused call against each sequence
/// alone over its contiguous kv_cache<S> and the paged reference against the
/// double reference on the widened values.
template <class S>
void check_more_encoders(char const* format) {
  std::vector<float> const w = random_vector<float>(static_cast<std::size_t>(32 * Hq), 61, -2, 2);
  posenc::relative_table<float> table(32, Hq);
  for (index_t b = 0; b < 32; ++b)
    for (index_t h = 0; h < Hq; ++h) table(b, h) = w[static_cast<std::size_t>(b * Hq + h)];
  auto const t5 = posenc::t5_bias<S>::rounded_from(posenc::t5_bias<float>({Hq, true, 32, 128}, table));
  // Distances clipped at 6 (the scenes' sequences are longer), tables drawn
  // wide enough that their terms move the result; Shaw with key terms only
  // (its value terms need value_dim == head_dim).
  index_t const K = 6;
  auto draw = [](index_t rows, index_t cols, std::uint64_t seed) {
    std::vector<float> const x = random_vector<float>(static_cast<std::size_t>(rows * cols), seed, -1, 1);
    posenc::relative_table<float> t(rows, cols);
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) t(r, c) = x[static_cast<std::size_t>(r * cols + c)];
    return t;
  };
  auto const clipped = posenc::clipped_bias<S>::rounded_from(posenc::clipped_bias<float>(K, Hq, draw(2 * K + 1, Hq, 62)));
  auto const shaw = posenc::shaw<S>::rounded_from(posenc::shaw<float>(K, draw(2 * K + 1, D, 63)));
  for (index_t page : {index_t(16), index_t(64)}) {
    scene<S> const sc(page, posenc::none{});
    std::string const base = std::string(format) + " page " + std::to_string(page);
    for (index_t memory : {index_t(0), index_t(9)}) {
      auto const txl = posenc_test::random_transformer_xl<float>(Hq, D, 6, 1024, 77, memory);
      std::string const what = base + " transformer-xl memory " + std::to_string(memory);
      INFO(what);
      // Transformer-XL's queries are the last of their sequence's tokens: at most 12 (sequence 1).
      check_calls(sc, txl, page, what, true, W / 2);
    }
    check_calls(sc, t5, page, base + " t5_bias<16-bit>", true, W / 2);
    check_calls(sc, clipped, page, base + " clipped_bias<16-bit>", true, W / 2);
    check_calls(sc, shaw, page, base + " shaw<16-bit>", true, W / 2);
  }
}

/// A 16-bit mask of extents (batch, heads, q, k): finite values of both
/// signs, some -inf, some 0; and the float mask of its widened values.
template <class M>
struct mask_pair {
  index_t batch, heads, q, k;
  std::vector<M> m16;
  std::vector<float> m32;
  mask_pair(index_t b, index_t h, index_t sq, index_t sk, std::uint64_t seed) : batch(b), heads(h), q(sq), k(sk) {
    std::size_t const n = static_cast<std::size_t>(b * h * sq * sk);
    std::vector<float> const v = random_vector<float>(n, seed, -4, 4);
    for (std::size_t i = 0; i < n; ++i) {
      float x = v[i];
      if (i % 5 == 1) x = -std::numeric_limits<float>::infinity();
      if (i % 7 == 2) x = 0.0f;
      m16.push_back(posenc::detail::to_storage<M>(x));
      m32.push_back(posenc::detail::stored_value<float>(m16.back()));
    }
  }
  posenc::mask_view<M> half() const { return posenc::make_mask(m16.data(), batch, heads, q, k); }
  posenc::mask_view<float> wide() const { return posenc::make_mask(m32.data(), batch, heads, q, k); }
  /// The mask of entry s alone, for a sequence of `keys` tokens (key j is its token j).
  posenc::mask_view<M> entry(index_t s, index_t keys) const {
    posenc::mask_view<M> m = half();
    if (batch > 1) m.data += s * m.batch_stride;
    m.batch = 1;
    m.k = std::min(k, keys);
    return m;
  }
};

/// out (widened) then lse of the paged call on Path over every sequence of
/// the scene, q and out of QS: with the 16-bit mask m16 when given, else with
/// opt alone; with the workspace ws when given.
template <class Path, class QS, class S, class E, class M>
std::vector<float> run_masked(scene<S> const& sc, std::vector<QS> const& q, index_t Sq, E const& enc,
                              posenc::attention_options<float> opt, posenc::mask_view<M> const* m16,
                              posenc::paged_attention_workspace<S>* ws = nullptr) {
  index_t const n = scene<S>::n_seq;
  std::vector<QS> out(static_cast<std::size_t>(n * Sq * Hq * Dv), posenc::detail::to_storage<QS>(-7.0f));
  std::vector<float> lse(static_cast<std::size_t>(n * Hq * Sq), -7.0f);
  opt.lse = lse;
  auto const qv = posenc::make_bshd(q.data(), n, Sq, Hq, D);
  auto const ov = posenc::make_bshd(out.data(), n, Sq, Hq, Dv);
  posenc::span<const index_t> const ids(sc.ids.data(), n);
  if (m16 && ws)
    posenc::attention<Path>(qv, sc.paged, ids, ov, enc, opt, *m16, *ws);
  else if (m16)
    posenc::attention<Path>(qv, sc.paged, ids, ov, enc, opt, *m16);
  else if (ws)
    posenc::attention<Path>(qv, sc.paged, ids, ov, enc, opt, *ws);
  else
    posenc::attention<Path>(qv, sc.paged, ids, ov, enc, opt);
  std::vector<float> r = widened(out);
  r.insert(r.end(), lse.begin(), lse.end());
  return r;
}

/// As run_masked with the 16-bit mask, each sequence alone over its
/// contiguous kv_cache<S> (the view call with the cache's keys, values and
/// positions) with its entry of the mask.
template <class Path, class QS, class S, class E, class M>
std::vector<float> run_flat_masked(scene<S> const& sc, std::vector<QS> const& q, index_t Sq, E const& enc,
                                   posenc::attention_options<float> const& opt, mask_pair<M> const& m) {
  index_t const n = scene<S>::n_seq;
  std::vector<QS> out(static_cast<std::size_t>(n * Sq * Hq * Dv), posenc::detail::to_storage<QS>(-7.0f));
  std::vector<float> lse(static_cast<std::size_t>(n * Hq * Sq), -7.0f);
  for (index_t s = 0; s < n; ++s) {
    posenc::kv_cache<S> const& f = sc.flat[static_cast<std::size_t>(s)];
    posenc::attention_options<float> o = opt;
    o.keys_rotated = f.keys_rotated();
    o.k_positions = posenc::position_span(f.first_position());
    o.q_positions = posenc::position_span(f.next_position() - Sq);
    o.lse = {lse.data() + s * Hq * Sq, Hq * Sq};
    posenc::attention<Path>(posenc::make_bshd(q.data() + s * Sq * Hq * D, 1, Sq, Hq, D), f.keys(), f.values(),
                            posenc::make_bshd(out.data() + s * Sq * Hq * Dv, 1, Sq, Hq, Dv), enc, o,
                            m.entry(s, f.length()));
  }
  std::vector<float> r = widened(out);
  r.insert(r.end(), lse.begin(), lse.end());
  return r;
}

/// The 16-bit mask of type M over the 16-bit pages of the scene, for mask
/// shapes per entry and broadcast, key extents past every sequence (cut) and
/// short (masking the keys past it): the paged call equals the same call
/// with the float mask of the widened values bit for bit (out and lse; fused
/// and reference; float and all-16-bit q and out), and each sequence alone
/// over its contiguous cache with its entry of the mask (the reference
/// always; the fused path where check_calls finds it bit for bit).
template <class M, class S, class E>
void check_masks(scene<S> const& sc, E const& enc, index_t page, std::string const& base) {
  using posenc::path::fused;
  using posenc::path::reference;
  index_t const n = scene<S>::n_seq;
  bool const whole_tiles = page % posenc::detail::fused_default_traits<float>::block_kv_v == 0;
  struct call {
    index_t sq;
    int threads;
  };
  for (bool causal : {false, true})
    for (call c : {call{1, 1}, call{3, 1}, call{W, 1}, call{1, 2}}) {
      posenc::attention_options<float> opt;
      opt.causal = causal;
      opt.threads = c.threads;
      // One thread, and the row kernel or whole tiles (as in check_calls; none and ALiBi here).
      bool const exact = c.threads == 1 && (posenc_test::paged_row_kernel<float, S>(c.sq * (Hq / Hkv)) || whole_tiles);
      std::vector<float> const qf = make_queries<float>(sc.toks, c.sq);
      std::vector<S> const qh = make_queries<S>(sc.toks, c.sq);
      // The longest sequence has 51 tokens.
      for (mask_pair<M> const& m : {mask_pair<M>(n, Hq, c.sq, 60, 41), mask_pair<M>(1, 1, 1, 60, 42),
                                    mask_pair<M>(n, 1, c.sq, 20, 43), mask_pair<M>(1, Hq, 1, 51, 44)}) {
        INFO(base << (causal ? " causal" : "") << " Sq " << c.sq << " threads " << c.threads << " mask " << m.batch
                  << " x " << m.heads << " x " << m.q << " x " << m.k);
        posenc::mask_view<M> const mh = m.half();
        posenc::attention_options<float> ow = opt;
        ow.mask = m.wide();
        posenc::mask_view<M> const* none = nullptr;
        CHECK(same_bits(run_masked<fused>(sc, qf, c.sq, enc, opt, &mh), run_masked<fused>(sc, qf, c.sq, enc, ow, none)));
        CHECK(same_bits(run_masked<reference>(sc, qf, c.sq, enc, opt, &mh),
                        run_masked<reference>(sc, qf, c.sq, enc, ow, none)));
        std::vector<float> const f16 = run_masked<fused>(sc, qh, c.sq, enc, opt, &mh);
        std::vector<float> const r16 = run_masked<reference>(sc, qh, c.sq, enc, opt, &mh);
        CHECK(same_bits(f16, run_masked<fused>(sc, qh, c.sq, enc, ow, none)));
        CHECK(same_bits(r16, run_masked<reference>(sc, qh, c.sq, enc, ow, none)));
        CHECK(same_bits(r16, run_flat_masked<reference>(sc, qh, c.sq, enc, opt, m)));
        if (exact) CHECK(same_bits(f16, run_flat_masked<fused>(sc, qh, c.sq, enc, opt, m)));
        // A workspace that ran a masked call keeps no mask for the next call.
        posenc::paged_attention_workspace<S> ws;
        CHECK(same_bits(run_masked<fused>(sc, qf, c.sq, enc, opt, &mh, &ws),
                        run_masked<fused>(sc, qf, c.sq, enc, opt, &mh)));
        CHECK(same_bits(run_masked<fused>(sc, qf, c.sq, enc, opt, none, &ws),
                        run_masked<fused>(sc, qf, c.sq, enc, opt, none)));
      }
    }
}

template <class S>
void check_all_masks(char const* format) {
  for (index_t page : {index_t(16), index_t(64)}) {
    posenc::alibi<float> const alibi(posenc::alibi_form::paper, Hq);
    scene<S> const sc(page, alibi);
    std::string const base = std::string(format) + " page " + std::to_string(page) + " alibi";
    check_masks<Eigen::half>(sc, alibi, page, base + " binary16 mask");
    check_masks<Eigen::bfloat16>(sc, alibi, page, base + " bfloat16 mask");
    check_masks<S>(scene<S>(page, posenc::none{}), posenc::none{}, page, std::string(format) + " none");
  }
}

/// Bad 16-bit masks throw with a sentence naming them before out or lse is written.
template <class S>
void check_mask_errors(char const* format) {
  INFO(format);
  scene<S> const sc(16, posenc::none{});
  index_t const n = scene<S>::n_seq;
  std::vector<float> const q = make_queries<float>(sc.toks, 1);
  std::vector<float> out(static_cast<std::size_t>(n * Hq * Dv), 42.0f), lse(static_cast<std::size_t>(n * Hq), 42.0f);
  std::vector<S> m(static_cast<std::size_t>(n * Hq * 2 * 64));
  auto const qv = posenc::make_bshd(q.data(), n, 1, Hq, D);
  auto const ov = posenc::make_bshd(out.data(), n, 1, Hq, Dv);
  posenc::span<const index_t> const ids(sc.ids.data(), n);
  posenc::attention_options<float> opt;
  opt.lse = lse;
  posenc::paged_attention_workspace<S> ws;
  auto const bad = [&](posenc::mask_view<S> const& mv, std::string const& message) {
    INFO(message);
    CHECK_THROWS_WITH(posenc::attention(qv, sc.paged, ids, ov, posenc::none{}, opt, mv), posenc_test::contains(message));
    CHECK_THROWS_WITH(posenc::attention<posenc::path::reference>(qv, sc.paged, ids, ov, posenc::none{}, opt, mv, ws),
                      posenc_test::contains(message));
  };
  bad(posenc::make_mask(static_cast<S const*>(m.data()), 3, Hq, 1, 64),
      "mask (16-bit).batch is 3, expected 1 or 4 (seq_ids.size())");
  bad(posenc::make_mask(static_cast<S const*>(m.data()), n, 3, 1, 64), "mask (16-bit).heads is 3, expected 1 or 4");
  bad(posenc::make_mask(static_cast<S const*>(m.data()), n, Hq, 2, 64), "mask (16-bit).q is 2, expected 1 or 1");
  bad(posenc::make_mask(static_cast<S const*>(nullptr), 1, 1, 1, 64), "mask (16-bit).data is null");
  // A mask inside the last entry's out, or inside lse: found whichever entry reads it.
  bad(posenc::make_mask(reinterpret_cast<S const*>(out.data() + (n - 1) * Hq * Dv), 1, 1, 1, 8),
      "overlaps mask (16-bit)");
  bad(posenc::make_mask(reinterpret_cast<S const*>(lse.data()), 1, 1, 1, 4), "overlaps mask (16-bit)");
  for (float x : out) CHECK(x == 42.0f);
  for (float x : lse) CHECK(x == 42.0f);
}

}  // namespace

TEST_CASE("paged_kv_cache<half>: transformer_xl and 16-bit T5, clipped and Shaw tables as over the contiguous 16-bit "
          "cache",
          "[paged][half]") {
  check_more_encoders<Eigen::half>("binary16");
}

TEST_CASE("paged_kv_cache<bfloat16>: transformer_xl and 16-bit T5, clipped and Shaw tables as over the contiguous "
          "16-bit cache",
          "[paged][half]") {
  check_more_encoders<Eigen::bfloat16>("bfloat16");
}

TEST_CASE("paged_kv_cache<half> and <bfloat16>: a 16-bit mask is the float mask of its widened values, bit for bit",
          "[paged][half][mask]") {
  check_all_masks<Eigen::half>("binary16");
  check_all_masks<Eigen::bfloat16>("bfloat16");
}

TEST_CASE("paged_kv_cache<half> and <bfloat16>: a bad 16-bit mask throws, nothing written", "[paged][half][errors]") {
  check_mask_errors<Eigen::half>("binary16");
  check_mask_errors<Eigen::bfloat16>("bfloat16");
}

namespace {

/// One row per kv head (Hq == Hkv) and head dims over several vector widths,
/// 5W + 2 for K and 9W + 3 for V: the decode row kernel's widest register
/// blocks, the pair of vectors bfloat16 widens together on AVX-512, a single
/// vector and a scalar tail, in both products. The paged decode (pages in one
/// run, and each page its own run in a fragmented pool) equals the contiguous
/// kv_cache<S> decode bit for bit (out and lse) on one thread, and both are
/// within the tolerance rule of the double reference on the widened values.
template <class S>
void check_wide_one_row(char const* name) {
  index_t const H = 3, Dk = 5 * W + 2, Dw = 9 * W + 3, L = 301;
  std::vector<float> const k = random_vector<float>(static_cast<std::size_t>(L * H * Dk), 61, -2, 2);
  std::vector<float> const v = random_vector<float>(static_cast<std::size_t>(L * H * Dw), 62);
  std::vector<float> const q = random_vector<float>(static_cast<std::size_t>(H * Dk), 63, -2, 2);
  auto keys = [&](index_t s, index_t n) { return posenc::make_bshd(k.data() + s * H * Dk, 1, n, H, Dk); };
  auto values = [&](index_t s, index_t n) { return posenc::make_bshd(v.data() + s * H * Dw, 1, n, H, Dw); };
  posenc::rope<float> rope(posenc::rope_layout::half_split, Dk);
  rope.reserve(1024);
  posenc::alibi<float> const alibi(posenc::alibi_form::paper, H);
  auto run = [&](auto const& enc, char const* enc_name) {
    posenc::kv_cache<S> flat(1, H, Dk, Dw);
    flat.append(keys(0, L), values(0, L), enc);
    for (bool fragmented : {false, true})
      for (index_t page : {16, 7})
        for (int threads : {1, 2}) {
          INFO(name << ", " << enc_name << (fragmented ? ", fragmented pool" : ", one run") << ", page " << page
                    << ", " << threads << " threads");
          index_t const need = (L + page - 1) / page;
          posenc::paged_kv_cache<S> cache(2 * need + 2, page, H, Dk, Dw);
          if (fragmented) {  // every other page taken by a one-token filler, freed in between
            std::vector<index_t> fillers;
            for (index_t n = 0; n < cache.pages(); ++n) {
              fillers.push_back(cache.add_sequence());
              cache.append(fillers.back(), keys(0, 1), values(0, 1), enc);
            }
            for (index_t id : fillers)
              if (cache.page_table(id)[0] % 2 == 0) cache.free(id);
          }
          index_t const id = cache.add_sequence();
          cache.append(id, keys(0, L), values(0, L), enc);
          auto const table = cache.page_table(id);
          bool run_of_pages = true;
          for (std::size_t p = 1; p < static_cast<std::size_t>(table.size()); ++p) run_of_pages = run_of_pages && table[p] == table[p - 1] + 1;
          REQUIRE(run_of_pages != fragmented);
          std::vector<float> want(static_cast<std::size_t>(H * Dw), 7.0f), got(want.size(), -7.0f);
          std::vector<float> ref(want.size(), 5.0f), plain(want.size(), 3.0f);
          std::vector<float> lse_want(static_cast<std::size_t>(H)), lse_got(lse_want.size());
          posenc::attention_options<float> opt;
          opt.causal = true;
          opt.threads = threads;
          opt.lse = lse_want;
          auto const qv = posenc::make_bshd(q.data(), 1, 1, H, Dk);
          posenc::attention<posenc::path::fused>(qv, flat, posenc::make_bshd(want.data(), 1, 1, H, Dw), enc, opt);
          opt.lse = lse_got;
          std::vector<index_t> const ids = {id};
          posenc::attention<posenc::path::fused>(qv, cache, ids, posenc::make_bshd(got.data(), 1, 1, H, Dw), enc, opt);
          if (threads == 1) {  // the same walk of the same keys (more threads may split a sequence otherwise)
            CHECK(want == got);
            CHECK(lse_want == lse_got);
          }
          // The double reference and the plain float implementation on the cached values, widened.
          std::vector<float> kw(static_cast<std::size_t>(L * H * Dk)), vw(static_cast<std::size_t>(L * H * Dw));
          for (index_t t = 0; t < L; ++t)
            for (index_t h = 0; h < H; ++h) {
              for (index_t d = 0; d < Dk; ++d)
                kw[static_cast<std::size_t>((t * H + h) * Dk + d)] =
                    posenc::detail::stored_value<float>(flat.keys()(0, t, h, d));
              for (index_t d = 0; d < Dw; ++d)
                vw[static_cast<std::size_t>((t * H + h) * Dw + d)] =
                    posenc::detail::stored_value<float>(flat.values()(0, t, h, d));
            }
          posenc::attention_options<float> o;
          o.causal = true;
          o.keys_rotated = flat.keys_rotated();
          o.q_positions = posenc::position_span(L - 1);
          auto const kv = posenc::make_bshd<const float>(kw.data(), 1, L, H, Dk);
          auto const vv = posenc::make_bshd<const float>(vw.data(), 1, L, H, Dw);
          posenc::attention<posenc::path::reference>(qv, kv, vv, posenc::make_bshd(ref.data(), 1, 1, H, Dw), enc, o);
          posenc::attention<posenc_test::plain_path>(qv, kv, vv, posenc::make_bshd(plain.data(), 1, 1, H, Dw), enc, o);
          auto const r = posenc_test::within_tolerance(want, ref, plain, 1e-6);
          auto const rp = posenc_test::within_tolerance(got, ref, plain, 1e-6);
          INFO("vs the reference on the widened values: contiguous " << r.describe() << "; paged " << rp.describe());
          CHECK(r.ok);
          CHECK(rp.ok);
        }
  };
  run(posenc::none{}, "none");
  run(rope, "rope");
  run(alibi, "alibi");
}

}  // namespace

TEST_CASE("paged_kv_cache<half> and <bfloat16>: one row per kv head, head dims over several vector widths: pages "
          "equal the contiguous cache bit for bit on one thread, and both the reference",
          "[paged][half]") {
  check_wide_one_row<Eigen::half>("binary16");
  check_wide_one_row<Eigen::bfloat16>("bfloat16");
}
}  // namespace attention_paged_half_tests
