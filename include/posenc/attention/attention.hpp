// SPDX-License-Identifier: MIT
// posenc::attention: the entry point, its compile-time checks and the path dispatcher.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "posenc/attention/fused.hpp"
#include "posenc/attention/materialized.hpp"
#include "posenc/attention/options.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/attention/reference.hpp"
#include "posenc/core/aligned_buffer.hpp"
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

/// Runs one path after validation. `AllowAdditive`: the module applies
/// additive encodings itself and calls this with its encoder.
template <class Path, bool AllowAdditive, class T, class E>
void run_attention(view<const T> q, view<const T> k, view<const T> v, view<T> out, E const& enc,
                   attention_options<T> const& opt) {
  using traits = encoder_traits<E>;
  static_assert(AllowAdditive || !traits::adds_to_embeddings,
                "posenc::attention: this encoder adds to embeddings, which the attention kernel "
                "cannot reach; call its add_to() on the input embeddings before the projections, "
                "or use multi_head_attention");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "posenc::attention: T must be float or double");
  if constexpr (std::is_same_v<Path, path::best>) {
    using fused_kernel = kernel<typename dependent_path<path::fused, E>::type>;
    if constexpr (fused_kernel::available) {
      if (opt.scores == nullptr) {
        run_attention<path::fused, AllowAdditive>(q, k, v, out, enc, opt);
        return;
      }
    }
    run_attention<path::materialized, AllowAdditive>(q, k, v, out, enc, opt);
  } else {
    using K = kernel<typename dependent_path<Path, E>::type>;
    attention_plan<T> plan = make_plan(q, k, v, out, enc, opt);
    if constexpr (!K::provides_scores) {
      require(opt.scores == nullptr, "posenc::attention", "scores is set, expected null (this path "
              "does not produce the scores output; use path::reference or path::materialized)");
    }
    if (plan.batch == 0 || plan.q_len == 0 || plan.q_heads == 0) return;  // nothing to write
    rotation_plan const rot = plan_rotation<K::rotates_itself>(plan, enc, opt.keys_rotated);
    if constexpr (traits::rotates_queries_keys) {
      if (rot.route == rotation_route::copies) {
        aligned_buffer<T> qbuf, kbuf;
        view<const T> const qr = rotated_copy(q, qbuf, enc, rot.q_ids.data(), rot.length);
        view<const T> const kr = rot.k_ids.empty() ? k : rotated_copy(k, kbuf, enc, rot.k_ids.data(), rot.length);
        K::run(plan, qr, kr, v, out, enc);
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

}  // namespace detail

/// Scaled dot-product attention with a positional encoder (docs/formulas.md 5).
///
/// out(b, i, h, :) = sum_j softmax_j(s_ij) v(b, j, h / (Hq / Hkv), :), with
/// s_ij = scale * q_i . k_j (+ Shaw term), softcapped, plus the encoder bias
/// and the masks; keys hidden by causal / window / padding / masks are -inf.
/// A row with no visible key gives zeros (and lse = -inf), never NaN.
///
/// @tparam Path path::reference, path::materialized, path::fused or
///         path::best (the fused path when available and no scores output is
///         requested, else the materialized path).
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
    static_assert(problem != contract_problem::value_type,
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
    if constexpr (!encoder_traits<E>::adds_to_embeddings && problem == contract_problem::none)
      detail::run_attention<Path, false>(q, k, v, out, enc, opt);
  }
}

}  // namespace posenc
