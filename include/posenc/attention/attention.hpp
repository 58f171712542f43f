// SPDX-License-Identifier: MIT
// posenc::attention: the entry point, its compile-time checks and the path dispatcher.
#pragma once

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <vector>

#include "posenc/attention/fused.hpp"
#include "posenc/attention/kv_cache.hpp"
#include "posenc/attention/materialized.hpp"
#include "posenc/attention/options.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/attention/reference.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/traits.hpp"
// Further paths specialize detail::kernel<Path>; include their headers here.

namespace posenc {
namespace detail {

template <class T>
struct identity {
  using type = T;
};
template <class T>
using identity_t = typename identity<T>::type;

/// `P`, made dependent on `D` so that kernel<P> is looked up at instantiation.
template <class P, class D>
struct dependent_path {
  using type = P;
};

template <class Path, bool AllowAdditive, class T, class Q, class KV, class O, class E>
void run_attention(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc,
                   attention_options<T> const& opt, half_masks const& masks16 = {});
template <class Path, bool AllowAdditive, class T, class Q, class KV, class O, class E>
void run_attention_here(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc,
                        attention_options<T> const& opt, half_masks const& masks16);

/// Keys and values of a call without their first `cut` rows, with options that
/// keep every remaining key and query at its distance: key lengths and masks
/// follow the keys. Without key positions the keys move to their new indices
/// and the queries with them (the kernels' plan for keys at their indices),
/// unless a query would then sit before position 0 where it sees keys (given
/// query positions, no causal rule): then, as with given key positions, every
/// key and query keeps its position (explicit ids). Every entry drops the
/// same `cut` (attention runs an entry alone when its cut differs). K and V
/// are stored as KV (T or a 16-bit type).
template <class T, class KV = T>
struct memory_cut {
  view<const KV> k, v;
  attention_options<T> opt;
  std::vector<index_t> lengths, q_ids, k_ids;

  template <class Q>
  memory_cut(view<const Q> q, view<const KV> k0, view<const KV> v0, attention_options<T> const& o, index_t cut)
      : k(k0), v(v0), opt(o) {
    index_t const B = q.batch, Sq = q.seq, Sk = k0.seq, n = Sk - cut;
    // A view with no element may have a null data pointer: it stays null (no arithmetic on null).
    if (k.data) k.data += cut * k.seq_stride;
    k.seq = n;
    if (v.data) v.data += cut * v.seq_stride;
    v.seq = n;
    if (!o.key_lengths.empty()) {
      for (index_t b = 0; b < B; ++b) lengths.push_back(std::max<index_t>(0, o.key_lengths[b] - cut));
      opt.key_lengths = span<const index_t>(lengths.data(), B);
    }
    cut_mask(opt.mask, cut);
    cut_mask(opt.bool_mask, cut);
    // The queries' positions in the whole call: given, or the defaults.
    for (index_t b = 0; b < B; ++b) {
      index_t const L = o.key_lengths.empty() ? Sk : o.key_lengths[b];
      for (index_t i = 0; i < Sq; ++i)
        q_ids.push_back(o.q_positions ? o.q_positions->at(b, i) : Sq == Sk ? i : L - Sq + i);
    }
    bool shift = !o.k_positions;
    if (shift && !o.causal && o.sliding_window <= 0)
      for (index_t p : q_ids) shift = shift && p - cut >= 0;
    if (shift) {
      for (index_t& p : q_ids) p -= cut;
    } else {
      for (index_t b = 0; b < B; ++b)
        for (index_t j = 0; j < n; ++j) k_ids.push_back(o.k_positions ? o.k_positions->at(b, cut + j) : cut + j);
      opt.k_positions = position_span::ids(k_ids.data(), B, n);
    }
    opt.q_positions = position_span::ids(q_ids.data(), B, Sq);
  }

  template <class M>
  static void cut_mask(mask_view<M>& m, index_t cut) noexcept {
    if (m.empty()) return;
    if (m.k > cut) {
      if (m.data) m.data += cut;  // a mask with no element (some extent 0) may have a null pointer
      m.k -= cut;
    } else {
      m.k = 0;  // every remaining key is beyond the mask's key extent: masked
    }
  }
};

/// Copy of q (batch, Sq, Hq, D) with the encoder's content bias of each head
/// added, in T (a 16-bit q is widened exactly, the sum rounded to T only).
template <class T, class Q, class E>
view<const T> content_shifted(view<const Q> q, aligned_buffer<T>& buf, E const& enc) {
  buf = aligned_buffer<T>::uninitialized(q.size());
  view<T> y = make_bshd(buf.data(), q.batch, q.seq, q.heads, q.dim);
  for (index_t b = 0; b < q.batch; ++b)
    for (index_t s = 0; s < q.seq; ++s)
      for (index_t h = 0; h < q.heads; ++h) {
        Q const* x = q.ptr(b, s, h);
        T const* u = enc.content_bias(h);
        T* o = y.ptr(b, s, h);
        for (index_t d = 0; d < q.dim; ++d) o[d] = stored_value<T>(x[d]) + u[d];
      }
  return y;
}

/// Copy of 16-bit keys x into a packed (batch, seq, head, dim) buffer,
/// widened, rotated in float by enc at the position ids (batch, seq) and
/// rounded once back to S.
template <class S, class E>
view<const S> rotated_half_copy(view<const S> x, std::vector<S>& buf, E const& enc, index_t const* ids,
                                index_t length) {
  std::vector<float> wide(static_cast<std::size_t>(x.size()));
  view<float> const y = make_bshd(wide.data(), x.batch, x.seq, x.heads, x.dim);
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h) widen_row(x.ptr(b, s, h), x.dim, y.ptr(b, s, h));
  enc.rotate(y, position_span::ids(ids, x.batch, x.seq), length);
  buf.resize(wide.size());
  for (std::size_t n = 0; n < wide.size(); ++n) buf[n] = to_storage<S>(wide[n]);
  return make_bshd(static_cast<S const*>(buf.data()), x.batch, x.seq, x.heads, x.dim);
}

/// Runs one path after validation. `AllowAdditive`: the module applies
/// additive encodings itself and calls this with its encoder. Compute type T
/// (from the options); K and V are stored as KV, q as Q and out as O: each T,
/// or a 16-bit type with float T (path::fused and path::reference; path::best
/// runs the fused path). A 16-bit q reaches the kernel as it is, or, when the
/// entry point rotates or shifts it, as a float copy that is never rounded.
/// `masks16`: additive masks stored in 16 bits, beside opt's float mask.
template <class Path, bool AllowAdditive, class T, class Q, class KV, class O, class E>
void run_attention(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc,
                   attention_options<T> const& opt, half_masks const& masks16) {
#if POSENC_COMPILED
  // posenc::compiled holds the whole fused call of its list (compiled/list.hpp): validation,
  // rotation and kernel, so that a consumer's unit compiles none of them.
  if constexpr (std::is_same_v<Path, path::fused> && std::is_same_v<T, float> &&
                compiled_kernels::has_forward<Q, KV, O, E>) {
    compiled_kernels::check_once();
    compiled_kernels::entry::attention_call(q, k, v, out, enc, opt, masks16);
  } else
#endif
  {
    run_attention_here<Path, AllowAdditive>(q, k, v, out, enc, opt, masks16);
  }
}

/// run_attention's work in this translation unit.
template <class Path, bool AllowAdditive, class T, class Q, class KV, class O, class E>
void run_attention_here(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc,
                        attention_options<T> const& opt, half_masks const& masks16) {
  constexpr bool half_io = !std::is_same_v<KV, T> || !std::is_same_v<Q, T> || !std::is_same_v<O, T>;
  using traits = encoder_traits<E>;
  if constexpr (has_memory_length<E>::value) {
    // A segment memory longer than the encoder's M keys: cut to its last M.
    // Entry b's memory is the keys before its queries among its own
    // (key_lengths[b]); entries whose cuts differ run one at a time.
    index_t const B = q.batch, Sq = q.seq, Sk = k.seq;
    index_t const cut = B > 0 ? entry_memory_cut(enc, opt, 0, Sq, Sk) : 0;
    bool uneven = false;
    for (index_t b = 1; b < B; ++b) uneven = uneven || entry_memory_cut(enc, opt, b, Sq, Sk) != cut;
    if (cut > 0 || uneven) {
      validate(q, k, v, out, enc, opt);  // the call as given, before anything is read past it
      check_half_masks("posenc::attention", masks16, q, k, out, opt);
      if (opt.scores) {
        index_t b = 0;  // the entry with the longest cut, named in the message
        for (index_t e = 1; e < B; ++e)
          if (entry_memory_cut(enc, opt, e, Sq, Sk) > entry_memory_cut(enc, opt, b, Sq, Sk)) b = e;
        index_t const L = opt.key_lengths.empty() ? Sk : opt.key_lengths[b];
        require(false, "posenc::attention", "scores is set with a memory of ", L - Sq,
                " keys, expected null (the encoder's memory_length() is ", enc.memory_length(),
                ": the memory is cut, so no scores column belongs to the first ", L - Sq - enc.memory_length(),
                " keys of batch entry ", b, ")");
      }
      if (uneven) {
        for (index_t b = 0; b < B; ++b)
          run_attention<Path, AllowAdditive>(entry_of(q, b), entry_of(k, b), entry_of(v, b), entry_of(out, b), enc,
                                             entry_options(opt, b, q.heads, Sq, Sk),
                                             entry_masks(masks16, b, Sk));
        return;
      }
      memory_cut<T, KV> const c(q, k, v, opt, cut);
      half_masks m = masks16;
      memory_cut<T, KV>::cut_mask(m.half, cut);
      memory_cut<T, KV>::cut_mask(m.bfloat16, cut);
      run_attention<Path, AllowAdditive>(q, c.k, c.v, out, enc, c.opt, m);
      return;
    }
  }
  static_assert(AllowAdditive || !traits::adds_to_embeddings,
                "posenc::attention: this encoder adds to embeddings, which the attention kernel "
                "cannot reach; call its add_to() on the input embeddings before the projections, "
                "or use multi_head_attention");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "posenc::attention: T must be float or double");
  static_assert(!half_io || !std::is_same_v<Path, path::materialized>,
                "posenc::attention: path::materialized takes q, k, v and out of one float or double type; "
                "16-bit tensors run on path::fused (or path::best) and path::reference");
  if constexpr (half_io && std::is_same_v<Path, path::best>) {
    run_attention<path::fused, AllowAdditive>(q, k, v, out, enc, opt, masks16);
  } else if constexpr (std::is_same_v<Path, path::best>) {
    // path::best is the fused path, and only it is compiled for the call: a
    // runtime fallback would compile the materialized path (Eigen's GEMM) into
    // every call, about a quarter of its compile time. The scores output is
    // asked of path::materialized or path::reference by name (the fused path
    // rejects it after the other checks).
    using fused_kernel = kernel<typename dependent_path<path::fused, E>::type>;
    if constexpr (fused_kernel::available) {
      run_attention<path::fused, AllowAdditive>(q, k, v, out, enc, opt, masks16);
    } else {
      run_attention<path::materialized, AllowAdditive>(q, k, v, out, enc, opt, masks16);
    }
  } else {
    using K = kernel<typename dependent_path<Path, E>::type>;
    attention_plan<T> plan = make_plan(q, k, v, out, enc, opt);
    check_half_masks("posenc::attention", masks16, q, k, out, opt);
    set_half_masks(plan, masks16);
    if constexpr (!std::is_same_v<typename dependent_path<Path, E>::type, path::fused>) {
      require(opt.products == product_precision::float32, "posenc::attention", "products is bfloat16, expected ",
              "float32 on this path (bfloat16 products run on path::fused and path::best)");
    }
    if constexpr (!K::provides_scores) {
      require(!opt.scores, "posenc::attention", "scores is set, expected null (path::fused and "
              "path::best do not produce the scores output; use path::materialized or path::reference)");
    }
    if (plan.batch == 0 || plan.q_len == 0 || plan.q_heads == 0) return;  // nothing to write
    if constexpr (has_content_bias<E, T>::value) {
      // Transformer-XL's u: every path sees q + u (content term and position term).
      aligned_buffer<T> qbuf;
      K::run(plan, content_shifted(q, qbuf, enc), k, v, out, enc);
    } else {
      rotation_plan const rot = plan_rotation<K::rotates_itself>(plan, enc, opt.keys_rotated);
      if constexpr (traits::rotates_queries_keys) {
        if (rot.route == rotation_route::copies) {
          aligned_buffer<T> qbuf, kbuf;
          view<const T> const qr = rotated_copy(q, qbuf, enc, rot.q_ids.data(), rot.length);
          if constexpr (!std::is_same_v<KV, T>) {
            std::vector<KV> hbuf;
            view<const KV> const kr =
                rot.k_ids.empty() ? k : rotated_half_copy(k, hbuf, enc, rot.k_ids.data(), rot.length);
            K::run(plan, qr, kr, v, out, enc);
          } else {
            view<const T> const kr =
                rot.k_ids.empty() ? k : rotated_copy(k, kbuf, enc, rot.k_ids.data(), rot.length);
            K::run(plan, qr, kr, v, out, enc);
          }
          return;
        }
        if constexpr (K::rotates_itself) {
          if (rot.route == rotation_route::in_kernel) {
            rotation_ids const ids = rot.ids();
            K::run(plan, q, k, v, out, enc, &ids);
            return;
          }
        }
      }
      K::run(plan, q, k, v, out, enc);
    }
  }
}

}  // namespace detail

namespace detail {

template <class E, class = void>
struct encoder_value_type {
  using type = void;
};
template <class E>
struct encoder_value_type<E, std::void_t<typename E::value_type>> {
  using type = typename E::value_type;
};

/// The compile-time checks of an encoder passed to posenc::attention with
/// views of element type T (a sentence for each problem); true when the call
/// can run.
template <class T, class E>
constexpr bool attention_encoder_ok() {
  if constexpr (!has_encoder_traits_v<E>) {
    static_assert(detail::dependent_false_v<E>,
                  "posenc::attention: E is not an encoder; specialize posenc::encoder_traits<E> "
                  "(see posenc/encoding/traits.hpp)");
  } else {
    static_assert(!encoder_traits<E>::adds_to_embeddings,
                  "posenc::attention: this encoder adds to embeddings, which the attention kernel "
                  "cannot reach; call its add_to() on the input embeddings before the projections, "
                  "or use multi_head_attention");
    // The encoder contract (encoding/traits.hpp): at most one of these fires.
    using detail::contract_problem;
    constexpr contract_problem problem = detail::encoder_contract_problem<E, T>();
    // A 16-bit table computes in float (its compute_type): float or 16-bit tensors only.
    constexpr bool half_table_off_float =
        is_half_storage_v<typename encoder_value_type<E>::type> && !std::is_same_v<T, float>;
    static_assert(!half_table_off_float,
                  "posenc::attention: an encoder with a 16-bit table (Eigen::half, Eigen::bfloat16) computes in "
                  "float; give it float or 16-bit q, k, v and out, or build the encoder with double for double "
                  "tensors");
    static_assert(problem != contract_problem::value_type || half_table_off_float,
                  "posenc::attention: the encoder's value_type is not the element type of q, k, v and out; "
                  "build the encoder with the views' element type (e.g. rope<float> for float views)");
    static_assert(problem != contract_problem::max_positions,
                  "posenc::attention: the encoder has no `index_t max_positions() const`; every encoder "
                  "needs one (return 0 when any position works)");
    static_assert(problem != contract_problem::rotate,
                  "posenc::attention: encoder_traits<E>::rotates_queries_keys is true but the encoder has no "
                  "`rotate(view<T>, position_span, index_t) const` for the views' element type T");
    static_assert(problem != contract_problem::bias_row,
                  "posenc::attention: encoder_traits<E>::biases_scores is true but the encoder has no "
                  "`bias_row(index_t, index_t, index_t, index_t, T*) const` for the views' element type T");
    static_assert(problem != contract_problem::heads,
                  "posenc::attention: encoder_traits<E>::biases_scores is true but the encoder has no "
                  "`index_t heads() const` (return 0 when any head count works)");
    static_assert(problem != contract_problem::relative_key_value,
                  "posenc::attention: encoder_traits<E>::relative_key_value is true but the encoder lacks one of "
                  "`score_row(T const*, index_t, index_t, index_t, T, T*) const`, "
                  "`value_row(T const*, index_t, index_t, index_t, T*) const`, `bool has_values() const`, "
                  "`index_t head_dim() const` for the views' element type T");
    return !encoder_traits<E>::adds_to_embeddings && problem == contract_problem::none;
  }
  return false;
}

}  // namespace detail

/// Scaled dot-product attention with a positional encoder (docs/formulas.md 5).
///
/// out(b, i, h, :) = sum_j softmax_j(s_ij) v(b, j, h / (Hq / Hkv), :), with
/// s_ij = scale * q_i . k_j (+ Shaw term), softcapped, plus the encoder bias
/// and the masks; keys hidden by causal / window / padding / masks are -inf.
/// A row with no visible key gives zeros (and lse = -inf), never NaN.
///
/// @tparam Path path::reference, path::materialized, path::fused or
///         path::best (the fused path; the scores output is asked of
///         path::materialized or path::reference).
/// @param q   (batch, Sq, Hq, D), last dim contiguous, any other strides
/// @param k   (batch, Sk, Hkv, D), Hq % Hkv == 0
/// @param v   (batch, Sk, Hkv, Dv)
/// @param out (batch, Sq, Hq, Dv)
/// @param enc an encoder whose traits say where it acts: rotation of copies
///        of q and k (keys skipped when opt.keys_rotated), bias_row, Shaw
///        score and value terms. Additive encoders are a compile error.
/// @throws posenc::error on any bad argument, before anything is written.
template <class Path = path::best, class T, class E>
void attention(view<const detail::identity_t<T>> q, view<const detail::identity_t<T>> k,
               view<const detail::identity_t<T>> v, view<T> out, E const& enc,
               attention_options<detail::identity_t<T>> const& opt = {}) {
  if constexpr (detail::attention_encoder_ok<T, E>()) detail::run_attention<Path, false>(q, k, v, out, enc, opt);
}

/// The call above with an additive mask stored in 16 bits (`mask_view<M>`, M
/// `Eigen::half` or `Eigen::bfloat16`), added beside opt.mask and
/// opt.bool_mask with the same shape rules (broadcast over batch, heads and
/// q; a short key extent masks the keys past it): each element is widened
/// exactly as it is read, so the result is that of a float mask holding the
/// widened values, bit for bit; -inf drops a key, 0 keeps it. Every path.
template <class Path = path::best, class T, class E, class M, std::enable_if_t<is_half_storage_v<M>, int> = 0>
void attention(view<const detail::identity_t<T>> q, view<const detail::identity_t<T>> k,
               view<const detail::identity_t<T>> v, view<T> out, E const& enc,
               attention_options<detail::identity_t<T>> const& opt, mask_view<M> const& mask16) {
  if constexpr (detail::attention_encoder_ok<T, E>())
    detail::run_attention<Path, false>(q, k, v, out, enc, opt, detail::half_masks_of(mask16));
}

namespace detail {

/// The compile-time checks of the element types of a posenc::attention call
/// with 16-bit tensors (q as Q, k as K, v as V, out as T; a sentence for each
/// problem); true when the mix is supported. The packed call uses them too.
template <class Q, class K, class V, class T>
constexpr bool half_io_types_ok() {
  using S = std::remove_const_t<K>;
  using QS = std::remove_const_t<Q>;
  static_assert(std::is_same_v<S, std::remove_const_t<V>>,
                "posenc::attention: k and v must have the same element type (both Eigen::half or both "
                "Eigen::bfloat16)");
  static_assert(!std::is_same_v<QS, double> && !std::is_same_v<T, double>,
                "posenc::attention: with 16-bit k and v (Eigen::half, Eigen::bfloat16), q and out must be "
                "float or of k and v's 16-bit type; double q or out is not supported");
  static_assert(std::is_same_v<QS, T>,
                "posenc::attention: q and out must have the same element type (both float, or both the "
                "16-bit type of k and v)");
  static_assert(std::is_same_v<QS, float> || std::is_same_v<QS, S>,
                "posenc::attention: q and out are float or the 16-bit type of k and v (all-16-bit tensors); "
                "16-bit q with float or double k and v, or with k and v of the other 16-bit type, is not "
                "supported");
  return std::is_same_v<S, std::remove_const_t<V>> && std::is_same_v<QS, T> &&
         (std::is_same_v<QS, float> || std::is_same_v<QS, S>) && is_half_storage_v<S>;
}

}  // namespace detail

/// Attention with 16-bit tensors, computed in float (path::reference: in
/// double), with the semantics, options and checks of the float call above.
/// Two mixes are supported:
/// - q and out float, k and v `Eigen::half` (IEEE binary16) or
///   `Eigen::bfloat16` (a 16-bit KV cache);
/// - q, k, v and out all of one 16-bit type (all-16-bit tensors).
/// The options are `attention_options<float>` in both: lse and scores are
/// float, the additive mask float. A 16-bit q is widened (exactly) as it is
/// read and stays float inside the kernel (RoPE rotates it in float); each
/// output element is rounded once to 16 bits, to nearest even (path::reference
/// rounds its double result to float first). path::fused (and path::best)
/// widens K and V rows in registers as it loads them (the lane kernel: each
/// key tile once into float scratch); path::materialized is not available.
/// Encoders are float (rope<float>, t5_bias<float>, ...) or keep a 16-bit
/// table and compute in float (t5_bias, clipped_bias and shaw of Eigen::half
/// or Eigen::bfloat16: exactly the float encoder of the widened table). Other
/// mixes (double q or out, 16-bit q with float k, q and out of different
/// types, a 16-bit table with double tensors) are compile errors with a sentence.
template <class Path = path::best, class T, class Q, class K, class V, class E,
          std::enable_if_t<is_half_storage_v<Q> || is_half_storage_v<K> || is_half_storage_v<V> ||
                               is_half_storage_v<T>,
                           int> = 0>
void attention(view<Q> q, view<K> k, view<V> v, view<T> out, E const& enc, attention_options<float> const& opt = {},
               detail::half_masks const& masks16 = {}) {
  using S = std::remove_const_t<K>;
  using QS = std::remove_const_t<Q>;
  if constexpr (detail::half_io_types_ok<Q, K, V, T>()) {
    if constexpr (detail::attention_encoder_ok<float, E>())
      detail::run_attention<Path, false>(view<const QS>(q), view<const S>(k), view<const S>(v), out, enc, opt,
                                         masks16);
  }
}

/// The 16-bit call above with an additive mask stored in 16 bits
/// (`mask_view<M>`, M `Eigen::half` or `Eigen::bfloat16`; either with either
/// tensor type): widened exactly as read, as for float tensors.
template <class Path = path::best, class T, class Q, class K, class V, class E, class M,
          std::enable_if_t<(is_half_storage_v<Q> || is_half_storage_v<K> || is_half_storage_v<V> ||
                            is_half_storage_v<T>) && is_half_storage_v<M>,
                           int> = 0>
void attention(view<Q> q, view<K> k, view<V> v, view<T> out, E const& enc, attention_options<float> const& opt,
               mask_view<M> const& mask16) {
  attention<Path>(q, k, v, out, enc, opt, detail::half_masks_of(mask16));
}

namespace detail {

template <class E, class = void>
struct has_parts_member : std::false_type {};
template <class E>
struct has_parts_member<
    E, std::void_t<decltype(std::tuple_size<std::decay_t<decltype(std::declval<E const&>().parts())>>::value)>>
    : std::true_type {};
template <class E, class = void>
struct has_head_dim_member : std::false_type {};
template <class E>
struct has_head_dim_member<E, std::void_t<decltype(index_t(std::declval<E const&>().head_dim()))>> : std::true_type {};

/// Requires every head_dim() the encoder (or a part of a compose) reports,
/// other than 0, to be the cache's head_dim: a RoPE or Shaw encoder built for
/// another head width does not belong to this cache.
template <class E>
void check_encoder_head_dim(char const* where, E const& enc, index_t head_dim) {
  if constexpr (has_parts_member<E>::value) {
    std::apply([&](auto const&... p) { (check_encoder_head_dim(where, p, head_dim), ...); }, enc.parts());
  } else if constexpr (has_head_dim_member<E>::value) {
    index_t const d = enc.head_dim();
    require(d == 0 || d == head_dim, where, "encoder head_dim() is ", d, ", expected ", head_dim,
            " (cache.head_dim())");
  } else {
    (void)where, (void)enc, (void)head_dim;
  }
}

}  // namespace detail

namespace detail {

/// The checks of an attention call over a kv_cache of element type S (q of
/// element type T), and the options they imply: keys rotated as stored, key
/// positions from the cache, bottom-right query positions by default.
template <class T, class Q, class S, class E>
void cache_call_options(view<const Q> q, kv_cache<S> const& cache, E const& enc, attention_options<T>& opt) {
  char const* w = "posenc::attention";
  if constexpr (has_encoder_traits_v<E>) {
    constexpr bool rotates = encoder_traits<E>::rotates_queries_keys;
    bool const stored_rotated = cache.keys_rotated();
    check_view(w, "q", q);
    check_equal(w, "q.batch", q.batch, cache.batch(), "cache.batch()");
    check_equal(w, "q.dim", q.dim, cache.head_dim(), "cache.head_dim()");
    require(!opt.k_positions, w, "k_positions is set, expected unset with a kv_cache (key j sits at "
                    "cache.first_position() + j = ", cache.first_position(), " + j)");
    require(opt.key_lengths.empty() && opt.key_lengths.data() == nullptr, w, "key_lengths has ",
                    opt.key_lengths.size(), " entries, expected none with a kv_cache (every sequence has "
                    "cache.length() = ", cache.length(), " keys; mask keys with mask or bool_mask)");
    require(!opt.keys_rotated || stored_rotated, w, "keys_rotated is true, expected false (the ",
                    cache.length(), " cached keys are stored unrotated)");
    require(cache.length() == 0 || rotates == stored_rotated, w, "the encoder's rotates_queries_keys is ",
                    rotates ? "true" : "false", ", expected ", stored_rotated ? "true" : "false", " (the ",
                    cache.length(), " cached keys are stored ", stored_rotated ? "rotated" : "unrotated",
                    ": attend with an encoder that acts as the one used on append)");
    check_encoder_head_dim(w, enc, cache.head_dim());  // before the rotation's identity: the plainer fault
    if constexpr (rotates) {
      if (stored_rotated) {
        // Compared without building anything (a decode step allocates nothing); texts only to fail.
        encoder_identity const& rotation = rotation_identity_of(enc);
        if (rotation != cache.key_rotation())
          fail(w, "the encoder rotates as ", rotation.text(), ", expected ", cache.key_rotation().text(), " (the ",
               cache.length(),
                " cached keys were rotated so: attend with the encoder used on append)");
      }
    }
    opt.keys_rotated = stored_rotated;
    opt.k_positions = position_span(cache.first_position());
    // next_position() <= position_limit and q.seq >= 0 (checked): no overflow.
    if (!opt.q_positions) opt.q_positions = position_span(cache.next_position() - q.seq);
  }
}

}  // namespace detail

/// Attention of q over the keys and values held by a kv_cache: what is cached
/// and where it sits comes from the cache and cannot disagree with it.
///
/// - Keys: `cache.keys()`, taken as already rotated exactly when the cache
///   stores them rotated (`cache.keys_rotated()`, set by `append` with a
///   rotating encoder). `opt.keys_rotated` is set from the cache; leaving it
///   false (its default) is fine, setting it true over unrotated keys throws.
/// - Key positions: key j sits at `cache.first_position() + j`;
///   `opt.k_positions` must be unset.
/// - Key lengths: every sequence has `cache.length()` keys; `opt.key_lengths`
///   must be empty (mask keys with `opt.mask` / `opt.bool_mask`).
/// - Query positions: by default the Sq queries are the last Sq tokens
///   appended (bottom-right): query i at `cache.next_position() - Sq + i`.
///   `opt.q_positions` overrides it (e.g. queries that were not appended).
/// - The encoder must act as it did on `append`: it rotates exactly when the
///   cached keys are rotated (for a non-empty cache), then as the encoder that
///   rotated them (`rotation_identity_of(enc) == cache.key_rotation()`, else
///   posenc::error naming both), and any `head_dim()` it (or a part of a
///   compose) reports is `cache.head_dim()`.
///
/// @param q   (batch, Sq, Hq, D), batch = cache.batch(), D = cache.head_dim(),
///            Hq a multiple of cache.kv_heads()
/// @param cache the keys and values, appended with an encoder acting as `enc`
/// @param out (batch, Sq, Hq, cache.value_dim())
/// @throws posenc::error on any bad argument or contradiction, before anything is written.
template <class Path = path::best, class T, class E, std::enable_if_t<!is_half_storage_v<T>, int> = 0>
void attention(view<const detail::identity_t<T>> q, kv_cache<T> const& cache, view<detail::identity_t<T>> out,
               E const& enc, attention_options<detail::identity_t<T>> opt = {}) {
  // T is deduced from the cache alone: a call with views in that place never names kv_cache<const T>.
  detail::cache_call_options(q, cache, enc, opt);
  attention<Path, T>(q, cache.keys(), cache.values(), out, enc, opt);
}

/// Attention over a kv_cache stored in 16 bits (kv_cache<Eigen::half> or
/// kv_cache<Eigen::bfloat16>) with q and out float, or of the cache's 16-bit
/// type (all-16-bit): the same contract as the float cache above (positions,
/// rotation, lengths from the cache), computed in float by the fused path,
/// which widens each cached K and V row in registers as it loads it (no float
/// copy of the cache); a 16-bit out is rounded once. Options are float.
/// @param q   (batch, Sq, Hq, D) float or S
/// @param out (batch, Sq, Hq, cache.value_dim()) of q's type
/// @throws posenc::error on any bad argument or contradiction, before anything is written.
template <class Path = path::best, class S, class Q, class E,
          std::enable_if_t<is_half_storage_v<S> && (std::is_same_v<Q, float> || std::is_same_v<Q, S>), int> = 0>
void attention(view<const detail::identity_t<Q>> q, kv_cache<S> const& cache, view<Q> out, E const& enc,
               attention_options<float> opt = {}) {
  detail::cache_call_options(q, cache, enc, opt);
  attention<Path>(q, cache.keys(), cache.values(), out, enc, opt);
}

namespace detail {

/// The key extent of a 16-bit mask given to an attention call over a kv_cache:
/// 0 .. cache.length() (the keys are the cached ones; a shorter extent masks
/// the keys past it), said in the cache's terms; the other extents and the
/// aliasing are checked by the call itself before anything is written.
template <class M, class S>
void check_cache_half_mask(mask_view<M> const& m, kv_cache<S> const& cache) {
  require(m.empty() || (m.k >= 0 && m.k <= cache.length()), "posenc::attention", "mask (16-bit).k is ", m.k,
          ", expected 0 .. ", cache.length(), " (cache.length(); a shorter key extent masks the keys past it)");
}

}  // namespace detail

/// The float kv_cache call above with an additive mask stored in 16 bits
/// (`mask_view<M>`, M `Eigen::half` or `Eigen::bfloat16`), beside opt.mask
/// and opt.bool_mask with their rules: (1 or batch, 1 or Hq, 1 or Sq,
/// 0 .. cache.length()), a key extent shorter than cache.length() masking the
/// keys past it. Widened exactly as read: the result is that of a float mask
/// holding the widened values, bit for bit. Checked before anything is written.
template <class Path = path::best, class T, class E, class M,
          std::enable_if_t<!is_half_storage_v<T> && is_half_storage_v<M>, int> = 0>
void attention(view<const detail::identity_t<T>> q, kv_cache<T> const& cache, view<detail::identity_t<T>> out,
               E const& enc, attention_options<detail::identity_t<T>> opt, mask_view<M> const& mask16) {
  detail::cache_call_options(q, cache, enc, opt);
  detail::check_cache_half_mask(mask16, cache);
  attention<Path, T>(q, cache.keys(), cache.values(), out, enc, opt, mask16);
}

/// The 16-bit kv_cache call above with an additive mask stored in 16 bits
/// (either 16-bit type with either cache type), with the rules of the float
/// cache's 16-bit mask just above.
template <class Path = path::best, class S, class Q, class E, class M,
          std::enable_if_t<is_half_storage_v<S> && (std::is_same_v<Q, float> || std::is_same_v<Q, S>) &&
                               is_half_storage_v<M>,
                           int> = 0>
void attention(view<const detail::identity_t<Q>> q, kv_cache<S> const& cache, view<Q> out, E const& enc,
               attention_options<float> opt, mask_view<M> const& mask16) {
  detail::cache_call_options(q, cache, enc, opt);
  detail::check_cache_half_mask(mask16, cache);
  attention<Path>(q, cache.keys(), cache.values(), out, enc, opt, detail::half_masks_of(mask16));
}


}  // namespace posenc
