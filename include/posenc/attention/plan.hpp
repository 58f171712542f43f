// SPDX-License-Identifier: MIT
// Argument validation and the resolved per-call plan shared by every attention path.
#pragma once

// API (namespace posenc::detail) used by every kernel behind posenc::attention:
//
//   validate(q, k, v, out, enc, opt)      checks every argument, throws posenc::error
//                                         ("posenc::attention: <arg> is <value>, expected
//                                         <what>") before anything is written.
//   attention_plan<T> make_plan(q, k, v, out, enc, opt)
//                                         validate() + resolve defaults into a plan.
//   attention_plan<T>                     B, Sq, Sk, Hq, Hkv, group, D, Dv, scale, softcap,
//                                         causal, window, positions, key lengths, masks,
//                                         outputs (lse, scores), threads. Members:
//     kv_head(h)                          h / group (contiguous GQA groups)
//     q_position(b, i), k_position(b, j)  absolute positions (q may be negative)
//     key_length(b)                       keys j >= key_length(b) are padding
//     visible(b, i, j)                    key j visible to query i ignoring masks:
//                                         padding, causal, sliding window
//     visible_range(b, i, j0, j1)         sub-range [first, last) of [j0, j1) outside of
//                                         which no key is visible; `all` is true when every
//                                         key inside is visible (ignoring masks), so a tiled
//                                         kernel can skip whole tiles and per-key tests
//     row_has_visible(b, i)               some key is visible (ignoring masks)
//   encoder_terms<score_term::shaw | bias>(plan, enc, q_row, b, h, i, j0, n, tmp)
//                                         one of an encoder's score terms for a run of keys
//   rotation_plan plan_rotation<KernelRotates>(plan, enc, keys_rotated)
//                                         how q and k reach the kernel rotated: not at all,
//                                         inside its tiles, or as rotated copies
//   apply_masks(plan, b, h, i, j0, n, row) on a row of n scores for keys j0.. of query
//                                         (b, h, i): keys invisible by visible() or masked by
//                                         a bool mask (false) or by a short mask key extent
//                                         become -inf; the additive mask is added.
//   kernel<Path>                          dispatcher; primary template has `available =
//                                         false` and a run() that static_asserts. A path
//                                         specializes it with
//       static constexpr bool available = true;
//       static constexpr bool provides_scores;      // can fill opt.scores
//       static constexpr bool rotates_itself;       // can rotate q and k tiles itself
//       template <class T, class E>   // (class T, class KV, class E) to take 16-bit k, v
//       static void run(attention_plan<T> const&, view<const T> q, view<const T> k,
//                       view<const T> v, view<T> out, E const& enc,
//                       rotation_ids const* rot = nullptr);  // rot only when rotates_itself
//     Without `rot`, q and k arrive already rotated (copies made by the entry point).
//     `run` writes every element of out (zeros for rows with no visible key), plan.lse
//     (-inf for such rows) and plan.scores when non-null (only when provides_scores).
//
// Semantics (docs/formulas.md 5): s = scale * q.k (+ Shaw q.aK); s = c tanh(s / c) when softcap c > 0;
// s += bias(h, p_i, p_j) + additive mask; invisible / masked keys are -inf; softmax over keys;
// a row whose every key is -inf gives zeros and lse = -inf.
// Default query positions (an explicit q_positions always wins):
//   Sq == Sk: i. The queries are the keys' own tokens (a prefill, causal or not), query i is
//     key i; with key_lengths the entries are right-padded and each one gives what it gives
//     alone (its padding rows are the tail i >= key_length(b)). Without padding this is also
//     key_length(b) - Sq + i.
//   Sq != Sk: key_length(b) - Sq + i (bottom-right against the key length of the batch entry:
//     the KV-cache convention, also with a static cache and per-batch lengths).
//   The one layout this reads differently from bottom-right: a chunk as long as a static
//   cache's capacity while the cache holds fewer tokens (ONNX nonpad_kv_seqlen < Sq = Sk,
//   whose first rows sit at negative positions and see nothing); pass
//   q_positions = per_batch(key_length(b) - Sq) for it.
// Default key positions: j.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "posenc/attention/options.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/overlap.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc::detail {

/// A sub-range [first, last) of keys; `all` = every key inside is visible (ignoring masks).
struct key_range {
  index_t first = 0, last = 0;
  bool all = false;
  bool empty() const noexcept { return last <= first; }
};

/// Rotation inside a kernel (RoPE fused): the position id of every query row
/// and key, as the entry point rotates them, and the call's length. A kernel
/// with `rotates_itself` gets it when the encoder reports reserved_for(length)
/// and calls enc.rotate on each query block and key tile it loads.
struct rotation_ids {
  index_t const* q = nullptr;  // (batch, q_len), >= 0
  index_t const* k = nullptr;  // (batch, k_len); null: keys arrive rotated
  index_t length = 0;          // largest position + 1
};

/// Everything a kernel needs to know about one call, resolved once.
template <class T>
struct attention_plan {
  index_t batch = 0, q_len = 0, k_len = 0;     // B, Sq, Sk
  index_t q_heads = 0, kv_heads = 0, group = 1;  // Hq, Hkv, Hq / Hkv
  index_t head_dim = 0, value_dim = 0;         // D, Dv
  double scale = 1;                            // multiplies q.k
  double softcap = 0;                          // > 0: s = softcap * tanh(s / softcap)
  bool causal = false;                         // p_j <= p_i
  index_t window = 0;                          // > 0: p_i - window < p_j (implies causal)
  bool keys_are_indices = true;                // k_position(b, j) == j
  bool has_padding = false;                    // some key_length(b) < Sk
  std::vector<index_t> q_pos;                  // (batch, q_len)
  std::vector<index_t> k_pos;                  // (batch, k_len); empty when keys_are_indices
  std::vector<index_t> k_valid;                // (batch): key_length
  mask_view<T> mask;                           // additive, may be empty
  mask_view<bool> bool_mask;                   // true = attend, may be empty
  mask_view<Eigen::half> half_mask;            // additive in 16 bits, may be empty
  mask_view<Eigen::bfloat16> bfloat16_mask;    // additive in 16 bits, may be empty
  T* lse = nullptr;                            // (batch, Hq, Sq) or null
  T* scores = nullptr;                         // (batch, Hq, Sq, Sk) or null
  score_stage stage = score_stage::probabilities;
  int threads = 0;
  product_precision products = product_precision::float32;  // of q.k and p v (fused lane kernel)

  bool has_masks() const noexcept {
    return !mask.empty() || !bool_mask.empty() || !half_mask.empty() || !bfloat16_mask.empty();
  }
  bool restricts() const noexcept { return causal || window > 0; }
  index_t kv_head(index_t h) const noexcept { return h / group; }
  index_t q_position(index_t b, index_t i) const noexcept { return q_pos[static_cast<std::size_t>(b * q_len + i)]; }
  index_t k_position(index_t b, index_t j) const noexcept {
    return keys_are_indices ? j : k_pos[static_cast<std::size_t>(b * k_len + j)];
  }
  index_t key_length(index_t b) const noexcept { return k_valid[static_cast<std::size_t>(b)]; }

  /// Row of the scores output for (b, h, i) (Sk values), or null when not requested.
  T* scores_row(index_t b, index_t h, index_t i) const noexcept {
    return scores ? scores + ((b * q_heads + h) * q_len + i) * k_len : nullptr;
  }
  /// Writes the log-sum-exp of (b, h, i) when requested.
  void set_lse(index_t b, index_t h, index_t i, T value) const noexcept {
    if (lse) lse[(b * q_heads + h) * q_len + i] = value;
  }

  /// Key j visible to query i of batch entry b, ignoring masks.
  bool visible(index_t b, index_t i, index_t j) const noexcept {
    if (j >= k_valid[static_cast<std::size_t>(b)]) return false;
    if (!restricts()) return true;
    index_t const pi = q_position(b, i), pj = k_position(b, j);
    if (pj > pi) return false;
    return window <= 0 || pj > pi - window;
  }

  /// Sub-range of [j0, j1) outside which no key is visible to (b, i).
  key_range visible_range(index_t b, index_t i, index_t j0, index_t j1) const noexcept {
    key_range r{j0, std::min(j1, k_valid[static_cast<std::size_t>(b)]), false};
    if (r.empty()) return r;
    if (!restricts()) {
      r.all = true;
      return r;
    }
    if (!keys_are_indices) return r;  // arbitrary key positions: test each key
    index_t const pi = q_position(b, i);
    r.last = std::min(r.last, pi + 1);
    if (window > 0) r.first = std::max(r.first, pi - window + 1);
    if (r.last < r.first) r.last = r.first;
    r.all = true;
    return r;
  }

  /// Some key is visible to (b, i), ignoring masks.
  bool row_has_visible(index_t b, index_t i) const noexcept {
    key_range r = visible_range(b, i, 0, k_len);
    if (r.empty()) return false;
    if (r.all) return true;
    for (index_t j = r.first; j < r.last; ++j)
      if (visible(b, i, j)) return true;
    return false;
  }
};

/// Adds a 16-bit additive mask to a score row of apply_masks: as the float
/// mask, each element widened (exactly) once as it is read; -inf or a key past
/// the mask's key extent gives -inf.
template <class M, class S>
void add_half_mask(mask_view<M> const& mask, index_t b, index_t h, index_t i, index_t j0, index_t n,
                   S* row) noexcept {
  S const ninf = -std::numeric_limits<S>::infinity();
  M const* m = mask.row(b, h, i);
  index_t const mk = mask.k;
  for (index_t t = 0; t < n; ++t) {
    index_t const j = j0 + t;
    S const x = j < mk ? stored_value<S>(m[j]) : ninf;
    row[t] = x != ninf ? row[t] + x : ninf;
  }
}

/// Turns invisible and masked keys of a score row into -inf and adds the
/// additive mask (float, or 16-bit). `row[n]` holds the scores of keys j0 .. j0 + n - 1 of query
/// row i, head h, batch entry b. S is float or double.
template <class T, class S>
void apply_masks(attention_plan<T> const& plan, index_t b, index_t h, index_t i, index_t j0,
                 index_t n, S* row) noexcept {
  S const ninf = -std::numeric_limits<S>::infinity();
  key_range const r = plan.visible_range(b, i, j0, j0 + n);
  if (r.all) {  // one contiguous visible run: no per-key test
    index_t const lo = std::min(n, std::max<index_t>(0, r.first - j0));
    index_t const hi = std::max(lo, std::min(n, r.last - j0));
    for (index_t t = 0; t < lo; ++t) row[t] = ninf;
    for (index_t t = hi; t < n; ++t) row[t] = ninf;
  } else {
    for (index_t t = 0; t < n; ++t)
      if (!plan.visible(b, i, j0 + t)) row[t] = ninf;
  }
  if (!plan.mask.empty()) {
    T const* m = plan.mask.row(b, h, i);
    index_t const mk = plan.mask.k;
    for (index_t t = 0; t < n; ++t) {
      index_t const j = j0 + t;
      // -inf masks the key whatever its score holds (a NaN score + -inf would be NaN).
      row[t] = j < mk && m[j] != -std::numeric_limits<T>::infinity() ? row[t] + static_cast<S>(m[j]) : ninf;
    }
  }
  if (!plan.bool_mask.empty()) {
    bool const* m = plan.bool_mask.row(b, h, i);
    index_t const mk = plan.bool_mask.k;
    for (index_t t = 0; t < n; ++t) {
      index_t const j = j0 + t;
      if (j >= mk || !m[j]) row[t] = ninf;
    }
  }
  if (!plan.half_mask.empty()) add_half_mask(plan.half_mask, b, h, i, j0, n, row);
  if (!plan.bfloat16_mask.empty()) add_half_mask(plan.bfloat16_mask, b, h, i, j0, n, row);
}

/// Calls f(k_pos_first, t0, count) for each run of consecutive key positions
/// among keys j0 .. j0 + n - 1 of batch entry b (t0 = offset into the row).
template <class T, class F>
void for_each_key_run(attention_plan<T> const& plan, index_t b, index_t j0, index_t n, F&& f) noexcept {
  if (plan.keys_are_indices) {
    if (n > 0) f(j0, index_t{0}, n);
    return;
  }
  index_t t = 0;
  while (t < n) {
    index_t const first = plan.k_position(b, j0 + t);
    index_t len = 1;
    while (t + len < n && plan.k_position(b, j0 + t + len) == first + len) ++len;
    f(first, t, len);
    t += len;
  }
}

/// Which of an encoder's score terms encoder_terms adds.
enum class score_term {
  shaw,  ///< Shaw's scale * q.aK(p_j - p_i) (relative_key_value encoders)
  bias,  ///< the score bias b(h, p_i, p_j) (biases_scores encoders)
};

/// Writes the encoder's `Term` for keys j0 .. j0 + n - 1 of (b, h, i) into
/// `tmp[n]` (zeros when the encoder has no such term). Rows at a negative
/// position (no visible key) get zeros.
template <score_term Term, class T, class E>
void encoder_terms(attention_plan<T> const& plan, E const& enc, T const* q_row, index_t b, index_t h,
                   index_t i, index_t j0, index_t n, T* tmp) noexcept {
  for (index_t t = 0; t < n; ++t) tmp[t] = T(0);
  index_t const pi = plan.q_position(b, i);
  if (pi < 0) return;
  using traits = encoder_traits<E>;
  if constexpr (Term == score_term::shaw && traits::relative_key_value) {
    T const sc = static_cast<T>(plan.scale);
    for_each_key_run(plan, b, j0, n, [&](index_t kp, index_t t0, index_t len) {
      if constexpr (has_headed_score_row<E, T>::value)
        enc.score_row(h, q_row, pi, kp, len, sc, tmp + t0);
      else
        enc.score_row(q_row, pi, kp, len, sc, tmp + t0);
    });
  } else if constexpr (Term == score_term::bias && traits::biases_scores) {
    for_each_key_run(plan, b, j0, n, [&](index_t kp, index_t t0, index_t len) {
      enc.bias_row(h, pi, kp, len, tmp + t0);
    });
  } else {
    (void)enc, (void)q_row, (void)h;
  }
}

/// Adds Shaw's value term sum_j p[j] aV(p_j - p_i) for keys j0 .. j0 + n - 1
/// into out_row (value_dim values), when the encoder has value embeddings.
template <class T, class E>
void encoder_values(attention_plan<T> const& plan, E const& enc, T const* prob, index_t b, index_t i,
                    index_t j0, index_t n, T* out_row) noexcept {
  if constexpr (encoder_traits<E>::relative_key_value) {
    index_t const pi = plan.q_position(b, i);
    if (pi < 0 || !enc.has_values()) return;
    for_each_key_run(plan, b, j0, n, [&](index_t kp, index_t t0, index_t len) {
      enc.value_row(prob + t0, pi, kp, len, out_row);
    });
  } else {
    (void)plan, (void)enc, (void)prob, (void)b, (void)i, (void)j0, (void)n, (void)out_row;
  }
}

/// Dispatcher over path tags. A path specializes it (see the API at the top).
template <class Path>
struct kernel {
  static constexpr bool available = false;
  static constexpr bool provides_scores = false;
  static constexpr bool rotates_itself = false;
  template <class T, class E>
  static void run(attention_plan<T> const&, view<const T>, view<const T>, view<const T>, view<T>,
                  E const&) {
    static_assert(dependent_false_v<E>,
                  "posenc::attention: this path is not available; include its header "
                  "(posenc/attention/reference.hpp, materialized.hpp or fused.hpp) or use "
                  "path::reference / path::materialized");
  }
};

/// Checks a (batch, heads, q, k) mask against the call's shapes: a null data
/// pointer only with no element to read (a default-constructed mask_view is
/// no mask), and the element count and the largest element offset (sum of
/// (extent - 1) x |stride|, broadcast dims excluded) fit index_t.
template <class M>
void check_mask(char const* where, char const* name, mask_view<M> const& m, index_t B, index_t Hq,
                index_t Sq, index_t Sk) {
  if (m.empty()) return;
  require(m.batch == 1 || m.batch == B, where, name, ".batch is ", m.batch, ", expected 1 or ", B,
          " (q.batch)");
  require(m.heads == 1 || m.heads == Hq, where, name, ".heads is ", m.heads, ", expected 1 or ", Hq,
          " (q.heads)");
  require(m.q == 1 || m.q == Sq, where, name, ".q is ", m.q, ", expected 1 or ", Sq, " (q.seq)");
  require(m.k >= 0 && m.k <= Sk, where, name, ".k is ", m.k, ", expected 0 .. ", Sk,
          " (k.seq; a shorter key extent masks the keys past it)");
  index_t n = checked_mul(where, m.batch, m.heads, name, ".batch x ", name, ".heads");
  n = checked_mul(where, n, m.q, name, ".batch x ", name, ".heads x ", name, ".q");
  n = checked_mul(where, n, m.k, name, ".batch x ", name, ".heads x ", name, ".q x ", name, ".k");
  require(m.data != nullptr || n == 0, where, name, ".data is null, expected a buffer of ", n,
          " elements, or a default-constructed mask_view for no mask (extents ", m.batch, " x ", m.heads, " x ",
          m.q, " x ", m.k, ")");
  // Broadcast dims (extent 1) contribute nothing: their stride is ignored.
  index_t off = checked_span_of(where, m.batch, m.batch_stride, "(", name, ".batch - 1) x |", name,
                                ".batch_stride|");
  off = checked_add(where, off,
                    checked_span_of(where, m.heads, m.head_stride, "(", name, ".heads - 1) x |", name,
                                    ".head_stride|"),
                    "the largest offset of ", name, " (batch and head terms)");
  off = checked_add(where, off,
                    checked_span_of(where, m.q, m.q_stride, "(", name, ".q - 1) x |", name, ".q_stride|"),
                    "the largest offset of ", name, " (batch, head and q terms)");
  checked_add(where, off, m.k > 0 ? m.k - 1 : 0, "the largest offset of ", name);
}

/// The additive masks stored in 16 bits of one attention call (each may be
/// empty), given beside the options (see posenc::attention).
struct half_masks {
  mask_view<Eigen::half> half;
  mask_view<Eigen::bfloat16> bfloat16;
  bool empty() const noexcept { return half.empty() && bfloat16.empty(); }
};

/// A 16-bit mask as half_masks.
inline half_masks half_masks_of(mask_view<Eigen::half> m) noexcept { return {m, {}}; }
inline half_masks half_masks_of(mask_view<Eigen::bfloat16> m) noexcept { return {{}, m}; }

/// Checks the 16-bit masks of a call as validate() checks the float mask
/// (shape, extents, element count) and that no output (out, lse, scores)
/// shares a byte with them; throws before anything is written.
template <class T, class Q, class KV, class O>
void check_half_masks(char const* w, half_masks const& m, view<const Q> q, view<const KV> k, view<O> out,
                      attention_options<T> const& opt) {
  if (m.empty()) return;
  check_mask(w, "mask (16-bit)", m.half, q.batch, q.heads, q.seq, k.seq);
  check_mask(w, "mask (16-bit)", m.bfloat16, q.batch, q.heads, q.seq, k.seq);
  auto const bytes = [](auto const& mv) {
    index_t const ext[3] = {mv.batch, mv.heads, mv.q}, str[3] = {mv.batch_stride, mv.head_stride, mv.q_stride};
    return make_byte_set(mv.data, std::size_t{2}, 3, ext, str, mv.k);
  };
  byte_set const in = m.half.empty() ? bytes(m.bfloat16) : bytes(m.half);
  index_t const rows = q.batch * q.heads * q.seq;  // fits: validated
  byte_set const outs[3] = {bytes_of(out), bytes_of(static_cast<T const*>(opt.lse.data()), rows),
                            opt.scores ? bytes_of(static_cast<T const*>(opt.scores.data()), rows * k.seq) : byte_set{}};
  char const* const names[3] = {"out", "lse", "scores"};
  for (int o = 0; o < 3; ++o)
    if (overlaps(outs[o], in))
      fail(w, names[o], " is at bytes ", byte_range(outs[o]), " and overlaps mask (16-bit) at ", byte_range(in),
           ", expected no shared memory");
}

/// Sets the 16-bit masks of a validated call into its plan.
template <class T>
void set_half_masks(attention_plan<T>& p, half_masks const& m) noexcept {
  p.half_mask = m.half;
  p.bfloat16_mask = m.bfloat16;
  // A null mask with extents has no element (validated): zero strides keep row() at null.
  if (!p.half_mask.empty() && p.half_mask.data == nullptr)
    p.half_mask.batch_stride = p.half_mask.head_stride = p.half_mask.q_stride = 0;
  if (!p.bfloat16_mask.empty() && p.bfloat16_mask.data == nullptr)
    p.bfloat16_mask.batch_stride = p.bfloat16_mask.head_stride = p.bfloat16_mask.q_stride = 0;
}

/// The encoder's memory_length() (transformer_xl), else 0.
template <class E>
index_t memory_length_of(E const& enc) noexcept {
  if constexpr (has_memory_length<E>::value) {
    return enc.memory_length();
  } else {
    (void)enc;
    return 0;
  }
}

/// Keys a call of Sq queries over Sk keys drops before attention: for an
/// encoder with a segment memory of M > 0 keys (transformer_xl), the memory
/// keys before its last M when it holds more; else 0.
template <class E>
index_t memory_cut_length(E const& enc, index_t sq, index_t sk) noexcept {
  if constexpr (has_memory_length<E>::value) {
    index_t const M = enc.memory_length();
    return M > 0 && sk - sq > M ? sk - sq - M : 0;
  } else {
    (void)enc, (void)sq, (void)sk;
    return 0;
  }
}

/// Keys batch entry b drops before attention: memory_cut_length at the
/// entry's own keys (key_lengths[b], else Sk), its memory being the keys
/// before its Sq queries. Entries of one call may differ.
template <class E, class T>
index_t entry_memory_cut(E const& enc, attention_options<T> const& opt, index_t b, index_t sq, index_t sk) noexcept {
  return memory_cut_length(enc, sq, opt.key_lengths.empty() ? sk : opt.key_lengths[b]);
}

/// Entry b of a (batch, ...) view as a batch-1 view.
template <class V>
V entry_of(V x, index_t b) noexcept {
  if (x.data) x.data += b * x.batch_stride;
  x.batch = 1;
  return x;
}

/// Mask entry b of a mask whose batch is the call's entries (or 1:
/// broadcast), its key extent cut to the sequence's `keys` (the keys past a
/// shorter extent stay masked).
template <class M>
mask_view<M> mask_entry(mask_view<M> m, index_t b, index_t keys) noexcept {
  if (m.empty()) return m;
  m.k = std::min(m.k, keys);
  if (m.batch == 1) return m;
  if (m.data) m.data += b * m.batch_stride;
  m.batch = 1;
  return m;
}

/// The 16-bit masks of entry b, cut as mask_entry cuts the float mask.
inline half_masks entry_masks(half_masks const& m, index_t b, index_t keys) noexcept {
  return {mask_entry(m.half, b, keys), mask_entry(m.bfloat16, b, keys)};
}

/// The options of batch entry b of a call of Sq queries over Sk keys, alone
/// (batch 1): its key length, positions, masks and lse rows (lse: Hq x Sq per entry).
template <class T>
attention_options<T> entry_options(attention_options<T> const& opt, index_t b, index_t hq, index_t sq, index_t sk) {
  attention_options<T> o = opt;
  if (!opt.key_lengths.empty()) o.key_lengths = span<const index_t>(opt.key_lengths.data() + b, 1);
  if (opt.q_positions) o.q_positions = opt.q_positions->entry(b);
  if (opt.k_positions) o.k_positions = opt.k_positions->entry(b);
  o.mask = mask_entry(opt.mask, b, sk);
  o.bool_mask = mask_entry(opt.bool_mask, b, sk);
  if (opt.lse) o.lse = output_span<T>(opt.lse.data() + b * hq * sq, hq * sq);
  return o;
}

/// Throws unless every query-key pair that can be visible (not padding; with
/// causal, p_j <= p_i and within the window) is at most `limit` apart:
/// a bound from the smallest and largest positions of each batch entry.
/// `memory`: the encoder's memory_length() M (0: none); an entry whose memory
/// holds more than M keys drops its first ones before attention (its
/// entry_memory_cut); the others keep their positions and the queries
/// theirs, so only the kept keys are checked.
template <class T, class Q, class KV>
void check_distances(char const* w, index_t limit, view<const Q> q, view<const KV> k,
                     attention_options<T> const& opt, index_t memory = 0) {
  index_t const B = q.batch, Sq = q.seq, Sk = k.seq;
  bool const restricted = opt.causal || opt.sliding_window > 0;
  for (index_t b = 0; b < B; ++b) {
    index_t const L = opt.key_lengths.empty() ? Sk : opt.key_lengths[b];
    index_t const cut = memory > 0 && L - Sq > memory ? L - Sq - memory : 0;
    if (L <= cut || Sq == 0) continue;
    index_t kmin = std::numeric_limits<index_t>::max(), kmax = std::numeric_limits<index_t>::min();
    for (index_t j = cut; j < L; ++j) {
      index_t const pj = opt.k_positions ? opt.k_positions->at(b, j) : j;
      kmin = std::min(kmin, pj);
      kmax = std::max(kmax, pj);
    }
    for (index_t i = 0; i < Sq; ++i) {
      index_t const pi = opt.q_positions ? opt.q_positions->at(b, i) : Sq == Sk ? i : L - Sq + i;
      index_t far = pi - kmin;  // positions are within +-position_limit: no overflow
      if (opt.sliding_window > 0) far = std::min(far, opt.sliding_window - 1);
      index_t const near = restricted ? std::max<index_t>(0, pi - kmax) : pi - kmax;
      if (restricted && pi < kmin) continue;  // sees no key
      require(far <= limit && near >= -limit, w, "query position of batch ", b, " row ", i, " is ", pi,
              " with keys at ", kmin, " .. ", kmax, ", expected every visible key within ", limit,
              " positions (the encoder's distance_limit())");
    }
  }
}

/// Validates every argument of posenc::attention; throws posenc::error before any write.
/// `w` names the caller in messages (attention_backward validates its forward arguments here too).
/// K and V are stored as KV, q as Q and out as O: T, or a 16-bit type (float T).
namespace compiled_kernels {
/// True for the (q, K/V, out, encoder) types whose fused forward kernel posenc::compiled holds
/// (specialized in compiled/forward.hpp where POSENC_COMPILED is defined): such calls have
/// the bfloat16 product mode whatever POSENC_BF16_PRODUCTS says here.
template <class Q, class KV, class O, class E>
inline constexpr bool has_forward = false;
}  // namespace compiled_kernels

template <class T, class Q, class KV, class O, class E>
void validate(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc,
              attention_options<T> const& opt, char const* w = "posenc::attention") {
  (void)enc;
  check_view(w, "q", q);
  check_view(w, "k", k);
  check_view(w, "v", v);
  check_view(w, "out", out);
  check_equal(w, "k.batch", k.batch, q.batch, "q.batch");
  check_equal(w, "v.batch", v.batch, q.batch, "q.batch");
  check_equal(w, "v.seq", v.seq, k.seq, "k.seq");
  check_equal(w, "k.dim", k.dim, q.dim, "q.dim");
  check_equal(w, "v.heads", v.heads, k.heads, "k.heads");
  check_equal(w, "out.batch", out.batch, q.batch, "q.batch");
  check_equal(w, "out.seq", out.seq, q.seq, "q.seq");
  check_equal(w, "out.heads", out.heads, q.heads, "q.heads");
  check_equal(w, "out.dim", out.dim, v.dim, "v.dim");
  if (q.heads > 0) {
    require(k.heads > 0 && q.heads % k.heads == 0, w, "q.heads is ", q.heads,
            ", expected a multiple of k.heads (", k.heads, ")");
  }
  // The kernels use scale and softcap as T, and 1 / softcap: each must be 0 or
  // a normal T (softcap also with a normal reciprocal), else it overflows,
  // becomes 0 or a subnormal, or makes inf * 0 = NaN in T although it is fine as double.
  char const* const t_name = std::is_same_v<T, float> ? "float" : "double";
  require(opt.products == product_precision::float32 || opt.products == product_precision::bfloat16, w,
          "products is ", static_cast<int>(opt.products), ", expected float32 or bfloat16");
  constexpr bool bf16_products = POSENC_BF16_PRODUCTS || (std::is_same_v<T, float> &&
                                                           compiled_kernels::has_forward<Q, KV, O, E>);
  require(opt.products == product_precision::float32 || bf16_products, w,
          "products is bfloat16, expected float32: bfloat16 products are compiled only where "
          "POSENC_BF16_PRODUCTS=1 is defined (in every translation unit of the program)");
  require(opt.products == product_precision::float32 || std::is_same_v<T, float>, w,
          "products is bfloat16 with ", t_name, " tensors, expected float32 (bfloat16 products are a float mode)");
  double const t_min = static_cast<double>(std::numeric_limits<T>::min());
  double const t_max = static_cast<double>(std::numeric_limits<T>::max());
  if (opt.scale) {
    double const s = *opt.scale;
    require(s == 0 || (s >= t_min && s <= t_max), w, "scale is ", s, ", expected a finite value >= 0 that is 0 or ",
            "normal as ", t_name, " (", std::numeric_limits<T>::min(), " .. ", std::numeric_limits<T>::max(), ")");
  }
  double const c = opt.softcap;
  require(c == 0 || (c >= t_min && c <= 1.0 / t_min), w, "softcap is ", c,
          ", expected a finite value >= 0 (0 = off) that is 0 or normal as ", t_name, " with a normal reciprocal (",
          std::numeric_limits<T>::min(), " .. ", T(1) / std::numeric_limits<T>::min(), ")");
  require(opt.sliding_window >= 0, w, "sliding_window is ", opt.sliding_window,
          ", expected >= 0 (0 = off)");
  index_t const B = q.batch, Sq = q.seq, Sk = k.seq;
  // Positions: key j sits at j by default and query i at key_length - Sq + i,
  // so both lengths stay within the accepted position range (and key indices
  // far below the fused kernel's sentinel); the per-(batch, head) Sq x Sk
  // scores of the materialized path have a size that fits index_t.
  require(Sq <= position_limit, w, "q.seq is ", Sq, ", expected <= ", position_limit, " (position_limit)");
  require(Sk <= position_limit, w, "k.seq is ", Sk, ", expected <= ", position_limit, " (position_limit)");
  checked_mul(w, Sq, Sk, "q.seq x k.seq");
  if (opt.scores) {
    checked_mul(w, checked_mul(w, B, q.heads, "q.batch x q.heads") * Sq, Sk,
                "scores size q.batch x q.heads x q.seq x k.seq");
  }
  check_output_span(w, "lse", opt.lse, B * q.heads * Sq, "q.batch x q.heads x q.seq");  // fits: q is checked
  if (opt.scores)
    check_output_span(w, "scores", opt.scores, B * q.heads * Sq * Sk, "q.batch x q.heads x q.seq x k.seq");
  if (!opt.key_lengths.empty() || opt.key_lengths.data() != nullptr) {
    require(opt.key_lengths.size() == B, w, "key_lengths has ", opt.key_lengths.size(),
            " entries, expected ", B, " (q.batch)");
    require(opt.key_lengths.data() != nullptr || B == 0, w,
            "key_lengths.data is null, expected ", B, " entries");
    for (index_t b = 0; b < B; ++b) {
      index_t const L = opt.key_lengths[b];
      require(L >= 0 && L <= Sk, w, "key_lengths[", b, "] is ", L, ", expected 0 .. ", Sk,
              " (k.seq)");
    }
  }
  check_mask(w, "mask", opt.mask, B, q.heads, Sq, Sk);
  check_mask(w, "bool_mask", opt.bool_mask, B, q.heads, Sq, Sk);
  if (opt.k_positions) opt.k_positions->validate(w, "k_positions", B, Sk);
  if (opt.q_positions) opt.q_positions->validate_shape(w, "q_positions", B, Sq);

  using traits = encoder_traits<E>;
  constexpr bool uses_positions =
      traits::rotates_queries_keys || traits::biases_scores || traits::relative_key_value;
  if constexpr (traits::biases_scores) {
    index_t const eh = enc.heads();
    require(eh == 0 || eh == q.heads, w, "encoder heads() is ", eh, ", expected ", q.heads,
            " (q.heads) or 0");
  }
  if constexpr (traits::relative_key_value) {
    index_t const ed = enc.head_dim();
    require(ed == q.dim, w, "encoder head_dim() is ", ed, ", expected ", q.dim, " (q.dim)");
    if (enc.has_values()) {
      require(v.dim == ed, w, "v.dim is ", v.dim, ", expected ", ed,
              " (the encoder's head_dim: it adds value embeddings)");
    }
  }
  if constexpr (traits::relative_key_value && has_heads_hook<E>::value) {
    index_t const eh = enc.heads();
    require(eh == q.heads, w, "encoder heads() is ", eh, ", expected ", q.heads, " (q.heads)");
  }
  if constexpr (has_memory_length<E>::value) {
    // With default query positions the queries are the last Sq keys' tokens; given
    // positions place them anywhere (ring attention's blocks).
    require(Sq <= Sk || opt.q_positions, w, "q.seq is ", Sq, ", expected <= ", Sk,
            " (k.seq: the keys are the segment memory followed by the queries' own segment)");
  }
  if constexpr (uses_positions) {
    // Query positions: negative ones are fine when they see no key (causal);
    // an encoder cannot place a visible query before position 0.
    bool const restricted = opt.causal || opt.sliding_window > 0;
    index_t const max_pos = enc.max_positions();
    index_t kmax = -1;
    for (index_t b = 0; b < B; ++b) {
      for (index_t j = 0; j < Sk; ++j) {
        index_t const pj = opt.k_positions ? opt.k_positions->at(b, j) : j;
        kmax = std::max(kmax, pj);
      }
    }
    require(max_pos == 0 || kmax < max_pos, w, "largest key position is ", kmax,
            ", expected < ", max_pos, " (the encoder's max_positions())");
    for (index_t b = 0; b < B; ++b) {
      index_t const L = opt.key_lengths.empty() ? Sk : opt.key_lengths[b];
      for (index_t i = 0; i < Sq; ++i) {
        index_t const pi = opt.q_positions ? opt.q_positions->at(b, i) : Sq == Sk ? i : L - Sq + i;
        require(pi >= 0 || restricted, w, "query position of batch ", b, " row ", i, " is ", pi,
                ", expected >= 0 (the encoder needs positions; negative positions are only "
                "allowed with causal, where such rows see no key)");
        require(max_pos == 0 || pi < max_pos, w, "query position of batch ", b, " row ", i, " is ",
                pi, ", expected < ", max_pos, " (the encoder's max_positions())");
      }
    }
  }
  // Distances of the keys attended: after the memory cut, as the cut call has them.
  if constexpr (has_distance_limit<E>::value)
    check_distances(w, enc.distance_limit(), q, k, opt, memory_length_of(enc));

  // Aliasing: every path reads q, k, v and the masks while it writes out, lse
  // and scores, so no output may share a byte with an input or another output.
  // The one exception is out == q, the same view (in-place attention): each
  // path reads every query row an output row depends on before writing it.
  byte_set const in_sets[5] = {
      bytes_of(q), bytes_of(k), bytes_of(v),
      [&] {
        mask_view<T> const& m = opt.mask;
        index_t const ext[3] = {m.batch, m.heads, m.q}, str[3] = {m.batch_stride, m.head_stride, m.q_stride};
        return make_byte_set(m.data, sizeof(T), 3, ext, str, m.k);
      }(),
      [&] {
        mask_view<bool> const& m = opt.bool_mask;
        index_t const ext[3] = {m.batch, m.heads, m.q}, str[3] = {m.batch_stride, m.head_stride, m.q_stride};
        return make_byte_set(m.data, sizeof(bool), 3, ext, str, m.k);
      }()};
  char const* const in_names[5] = {"q", "k", "v", "mask", "bool_mask"};
  index_t const rows = B * q.heads * Sq;  // fits: a partial product of q's checked element count
  byte_set const out_sets[3] = {bytes_of(out), bytes_of(static_cast<T const*>(opt.lse.data()), rows),
                                opt.scores ? bytes_of(static_cast<T const*>(opt.scores.data()), rows * Sk) : byte_set{}};
  char const* const out_names[3] = {"out", "lse", "scores"};
  char const* const out_sizes[3] = {"", " (q.batch x q.heads x q.seq elements)",
                                    " (q.batch x q.heads x q.seq x k.seq elements)"};
  bool const in_place = static_cast<void const*>(out.data) == static_cast<void const*>(q.data) &&
                        sizeof(Q) == sizeof(O) && out.batch == q.batch && out.seq == q.seq && out.heads == q.heads &&
                        out.dim == q.dim && out.batch_stride == q.batch_stride && out.seq_stride == q.seq_stride &&
                        out.head_stride == q.head_stride;
  if (in_place) {
    require(!overlaps_itself(out_sets[0]), w, "out is q (in-place attention) with elements that overlap each other ",
            "(strides ", out.batch_stride, ", ", out.seq_stride, ", ", out.head_stride,
            "), expected a layout whose rows do not overlap");
  }
  for (int o = 0; o < 3; ++o) {
    for (int i = 0; i < 5; ++i) {
      if (o == 0 && i == 0 && in_place) continue;
      // byte_range formats a string: only on failure (a call allocates nothing to validate).
      if (overlaps(out_sets[o], in_sets[i]))
        fail(w, out_names[o], out_sizes[o], " is at bytes ",
              byte_range(out_sets[o]), " and overlaps ", in_names[i], " at ", byte_range(in_sets[i]),
              ", expected no shared memory", (o == 0 && i == 0)
                  ? " (or out exactly q: same data, extents and strides, for in-place attention)" : "");
    }
    for (int o2 = 0; o2 < o; ++o2) {
      if (overlaps(out_sets[o], out_sets[o2]))
        fail(w, out_names[o], out_sizes[o], " is at bytes ",
              byte_range(out_sets[o]), " and overlaps ", out_names[o2], " at ", byte_range(out_sets[o2]),
              ", expected no shared memory");
    }
  }
}

/// validate() and resolve the defaults into a plan.
template <class T, class Q, class KV, class O, class E>
attention_plan<T> make_plan(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out,
                            E const& enc, attention_options<T> const& opt, char const* where = "posenc::attention") {
  validate(q, k, v, out, enc, opt, where);
  attention_plan<T> p;
  p.batch = q.batch;
  p.q_len = q.seq;
  p.k_len = k.seq;
  p.q_heads = q.heads;
  p.kv_heads = k.heads;
  p.group = k.heads > 0 ? std::max<index_t>(1, q.heads / k.heads) : 1;
  p.head_dim = q.dim;
  p.value_dim = v.dim;
  p.scale = opt.scale ? *opt.scale : (q.dim > 0 ? 1.0 / std::sqrt(static_cast<double>(q.dim)) : 1.0);
  p.softcap = opt.softcap;
  // A window wider than any distance between accepted positions (2 x
  // position_limit) sees every causal key: clamped, p_i - window + 1 cannot overflow.
  p.window = std::min(opt.sliding_window, 2 * position_limit + 1);
  p.causal = opt.causal || opt.sliding_window > 0;
  p.k_valid.assign(static_cast<std::size_t>(p.batch), p.k_len);
  if (!opt.key_lengths.empty()) {
    for (index_t b = 0; b < p.batch; ++b) {
      p.k_valid[static_cast<std::size_t>(b)] = opt.key_lengths[b];
      p.has_padding = p.has_padding || p.k_valid[static_cast<std::size_t>(b)] < p.k_len;
    }
  }
  // Default query positions (see the top of this file): with Sq == Sk the
  // queries are the keys' own tokens, row i at key i's index i (a right-padded
  // entry's padding rows are its tail); otherwise bottom-right against the
  // entry's key length (a decode step or a chunk over a static cache).
  bool const queries_are_keys = p.q_len == p.k_len;
  p.q_pos.resize(static_cast<std::size_t>(p.batch * p.q_len));
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t i = 0; i < p.q_len; ++i)
      p.q_pos[static_cast<std::size_t>(b * p.q_len + i)] = opt.q_positions ? opt.q_positions->at(b, i)
                                 : queries_are_keys ? i
                                                    : p.k_valid[static_cast<std::size_t>(b)] - p.q_len + i;
  if (opt.k_positions) {
    bool indices = true;
    p.k_pos.resize(static_cast<std::size_t>(p.batch * p.k_len));
    for (index_t b = 0; b < p.batch; ++b)
      for (index_t j = 0; j < p.k_len; ++j) {
        index_t const pj = opt.k_positions->at(b, j);
        p.k_pos[static_cast<std::size_t>(b * p.k_len + j)] = pj;
        indices = indices && pj == j;
      }
    p.keys_are_indices = indices;
    if (indices) p.k_pos.clear();
  }
  p.mask = opt.mask;
  p.bool_mask = opt.bool_mask;
  // A null mask with extents has no element (validated): its rows are never
  // read, and zero strides keep row() at the null pointer itself.
  if (!p.mask.empty() && p.mask.data == nullptr) p.mask.batch_stride = p.mask.head_stride = p.mask.q_stride = 0;
  if (!p.bool_mask.empty() && p.bool_mask.data == nullptr)
    p.bool_mask.batch_stride = p.bool_mask.head_stride = p.bool_mask.q_stride = 0;
  p.lse = opt.lse.data();
  p.scores = opt.scores.data();
  p.stage = opt.scores_stage;
  p.threads = opt.threads;
  p.products = opt.products;
  return p;
}

/// How q and k reach a kernel rotated (encoders with rotates_queries_keys).
enum class rotation_route {
  none,       ///< nothing to rotate (no rotation, no key or a zero head dim)
  in_kernel,  ///< the kernel rotates each query block and key tile as it loads it
  copies,     ///< the entry point passes rotated copies of q (and of k)
};

/// The rotation of one call: its route, the position id of every query row
/// and key, and the length the encoder is asked for.
struct rotation_plan {
  rotation_route route = rotation_route::none;
  index_t length = 0;          // largest position + 1
  std::vector<index_t> q_ids;  // (batch, q_len), >= 0
  std::vector<index_t> k_ids;  // (batch, k_len); empty: keys arrive rotated
  rotation_ids ids() const noexcept { return {q_ids.data(), k_ids.empty() ? nullptr : k_ids.data(), length}; }
};

/// Plans the rotation of a validated call. `KernelRotates`: the kernel can
/// rotate its own tiles; it is asked to when the encoder reports its rotation
/// reserved for the call's length (then one row is rotated here first, so
/// that any error of the encoder is thrown now, before anything is written).
template <bool KernelRotates, class T, class E>
rotation_plan plan_rotation(attention_plan<T> const& plan, E const& enc, bool keys_rotated) {
  rotation_plan r;
  if constexpr (encoder_traits<E>::rotates_queries_keys) {
    if (plan.k_len == 0 || plan.head_dim == 0) return r;
    // length = largest position + 1 (dynamic scalings pick frequencies from
    // it): the largest key position (keys that are not padding, when there
    // are any), or a larger query position (queries past the keys: a partial
    // key range, as in sequence parallelism).
    index_t kmax = -1, kmax_all = -1, qmax = -1;
    for (index_t b = 0; b < plan.batch; ++b)
      for (index_t j = 0; j < plan.k_len; ++j) {
        index_t const pj = plan.k_position(b, j);
        kmax_all = std::max(kmax_all, pj);
        if (j < plan.key_length(b)) kmax = std::max(kmax, pj);
      }
    for (index_t p : plan.q_pos) qmax = std::max(qmax, p);
    r.length = std::max(kmax >= 0 ? kmax : kmax_all, qmax) + 1;
    // Rows at negative positions see no key (validated); rotate them as position 0.
    r.q_ids.resize(plan.q_pos.size());
    for (std::size_t t = 0; t < r.q_ids.size(); ++t) r.q_ids[t] = std::max<index_t>(0, plan.q_pos[t]);
    if (!keys_rotated) {
      r.k_ids.resize(static_cast<std::size_t>(plan.batch * plan.k_len));
      for (index_t b = 0; b < plan.batch; ++b)
        for (index_t j = 0; j < plan.k_len; ++j)  // padding keys are never visible
          r.k_ids[static_cast<std::size_t>(b * plan.k_len + j)] = j < plan.key_length(b) ? plan.k_position(b, j)
                                                                 : std::min(plan.k_position(b, j), r.length - 1);
    }
    r.route = rotation_route::copies;
    if constexpr (KernelRotates) {
      if (rotation_reserved(enc, r.length)) {
        std::vector<T> row(static_cast<std::size_t>(plan.head_dim));
        enc.rotate(make_bshd(row.data(), 1, 1, 1, plan.head_dim), position_span::ids(r.q_ids.data(), 1, 1),
                   r.length);
        r.route = rotation_route::in_kernel;
      }
    }
  } else {
    (void)plan, (void)enc, (void)keys_rotated;
  }
  return r;
}

/// Copy of x into a packed (batch, seq, head, dim) buffer of T, rotated by
/// enc at the position ids (batch, seq). x of a 16-bit type S is widened
/// (exactly) into the T copy, which stays T: no rounding beyond x's own.
template <class T, class S, class E>
view<T> rotated_copy(view<const S> x, aligned_buffer<T>& buf, E const& enc, index_t const* ids, index_t length) {
  buf = aligned_buffer<T>::uninitialized(x.size());
  view<T> y = make_bshd(buf.data(), x.batch, x.seq, x.heads, x.dim);
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h) {
        if constexpr (std::is_same_v<S, T>)
          std::copy(x.ptr(b, s, h), x.ptr(b, s, h) + x.dim, y.ptr(b, s, h));
        else
          widen_row(x.ptr(b, s, h), x.dim, y.ptr(b, s, h));
      }
  enc.rotate(y, position_span::ids(ids, x.batch, x.seq), length);
  return y;
}

}  // namespace posenc::detail
