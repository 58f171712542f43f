// SPDX-License-Identifier: MIT
// encoder_traits<E>: the one extension point, saying at compile time where an encoder acts.
#pragma once

#include <limits>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "posenc/core/eigen.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/identity.hpp"

namespace posenc {

/// Where encoder E acts. Specialize it for every encoder with exactly these
/// five `static constexpr bool` members:
///
/// | member                 | the encoder provides (T = its element type)                        |
/// |------------------------|---------------------------------------------------------------------|
/// | adds_to_embeddings     | `void add_to(token_view<T> x, position_span pos) const`             |
/// | rotates_queries_keys   | `void rotate(view<T> x, position_span pos, index_t length) const`  |
/// |                        |   (in place; `length` = current sequence length, used by dynamic    |
/// |                        |   scalings; the kernels pass the largest key position + 1)          |
/// | biases_scores          | `void bias_row(index_t head, index_t q_pos, index_t k_pos_first,   |
/// |                        |   index_t count, T* out) const noexcept` (adds into out[0..count))  |
/// |                        |   and `index_t heads() const noexcept` (0 = any head count)         |
/// | relative_key_value     | `void score_row(T const* q, index_t q_pos, index_t k_pos_first,    |
/// |                        |   index_t count, T scale, T* out) const noexcept` (adds             |
/// |                        |   scale * q . aK(k_pos - q_pos)), `void value_row(T const* p,       |
/// |                        |   index_t q_pos, index_t k_pos_first, index_t count, T* out) const  |
/// |                        |   noexcept` (adds sum_j p[j] aV(k_pos_j - q_pos)), `bool            |
/// |                        |   has_values() const`, `index_t head_dim() const`                   |
/// |                        |   score_row may instead take the head first: `score_row(index_t    |
/// |                        |   head, T const* q, ...)` (per-head tables, as transformer_xl)      |
/// | is_relative            | scores depend on positions only through p_i - p_j                  |
///
/// Every encoder also has `index_t max_positions() const noexcept`: 0 when any
/// position works, else the largest usable position + 1.
///
/// A rotating encoder may also have `bool reserved_for(index_t length) const`:
/// true when rotate() at that length is cheap (cos/sin precomputed, as after
/// rope::reserve). Fused attention then rotates each query block and key tile
/// inside the kernel; otherwise it rotates copies of q and k once per call.
///
/// Every encoder of the library also has `encoder_identity identity() const`
/// (posenc/encoding/identity.hpp): its kind and every parameter that changes
/// what it computes (extents, bases, scalings and each of their parameters,
/// forms, flags, the element type where it changes the numbers), and every
/// table it reads (learned rows, T5 and clipped buckets, Shaw embeddings,
/// Transformer-XL u, v and W_R, ALiBi slopes) by a digest of its contents, so
/// that equal identities give the same numbers and two encoders that differ in
/// one parameter differ in identity. KV caches compare the identity of the
/// encoder that rotated their keys, and ring ranks compare theirs before
/// attending. Rotating encoders are asked for it on every append and decode
/// step, so theirs is computed once and kept (rope: at construction; reserve()
/// does not change it). compose<E...> also has `rotation_identity()`, that of
/// its rotating parts only. An encoder without identity() is known by its type
/// alone (identity_of): its parameters are not compared.
///
/// A biasing encoder may also have `bool shift_invariant() const noexcept`:
/// true when bias_row(h, q_pos + s, k_pos + s, n) equals bias_row(h, q_pos,
/// k_pos, n) for every shift s, i.e. the bias is a function of k_pos - q_pos
/// alone (ALiBi paper and symmetric, T5, clipped; not ALiBi key_only, whose
/// rows differ by a constant). Fused attention then computes one diagonal of
/// nk + block - 1 values per tile instead of one row per query.
///
/// A relative_key_value encoder may also have (transformer_xl has all three):
/// - `T const* content_bias(index_t head) const noexcept`: head_dim values
///   added to every query of that head before anything reads it (the u of
///   Transformer-XL: the kernels see q + u, in q . k and in score_row);
/// - `index_t distance_limit() const`: posenc::attention checks that no
///   visible query-key pair is further apart than that;
/// - `index_t memory_length() const`: M > 0 cuts the keys before the last
///   q.seq + M (a segment memory longer than M keys) before attention;
/// - `distance_columns<T> columns(index_t head) const noexcept`: its
///   per-head table transposed, by distance (below); the fused path then
///   computes the term of a whole tile as one register-tiled product.
///
/// Backward (training). An encoder that can be trained has optional members
/// beside its forward hooks, in its own header; attention_backward and the
/// module detect them (an encoder without them is forward-only, and asking for
/// its backward is a compile error saying which one is missing):
///
/// | forward trait          | backward hook (T = element type, G = the encoder's gradients)       |
/// |------------------------|---------------------------------------------------------------------|
/// | adds_to_embeddings     | `void add_to_backward(token_view<const T> dx, position_span pos,    |
/// |                        |   G& g) const`: adds d(parameters) of x += PE(pos); d(x) passes      |
/// |                        |   through unchanged (validates like add_to, throws before writing)  |
/// | rotates_queries_keys   | `void rotate_transpose(view<T> dx, position_span pos, index_t       |
/// |                        |   length) const`: in place, dx = R(pos)^T dx (the gradient of the   |
/// |                        |   unrotated input from that of the rotated one)                     |
/// | biases_scores          | `void bias_row_backward(index_t head, index_t q_pos, index_t        |
/// |                        |   k_pos_first, index_t count, T const* dbias, G& g) const noexcept` |
/// |                        |   (adds d(parameters) of bias_row given d(bias) of each key)        |
/// | relative_key_value     | `void score_row_backward(T const* q, index_t q_pos, index_t         |
/// |                        |   k_pos_first, index_t count, T scale, T const* dscore, T* dq, G& g)|
/// |                        |   const noexcept` (dq[0..head_dim) += d(score_row)/dq, g += its     |
/// |                        |   parameter part) and `void value_row_backward(T const* p, T const* |
/// |                        |   dout, index_t q_pos, index_t k_pos_first, index_t count, T* dp,   |
/// |                        |   G& g) const noexcept` (dp[j] += dout . aV(k_pos_j - q_pos), g +=  |
/// |                        |   p[j] dout at that row; nothing without value embeddings)          |
///
/// score_row_backward may take the head first, as score_row does:
/// `score_row_backward(index_t head, T const* q, ...)` (transformer_xl). An
/// encoder with `content_bias` also needs, for its backward:
/// - `void content_bias_backward(index_t head, T const* dq, G& g) const
///   noexcept`: adds d(parameters) of the shift q + content_bias(head) given
///   the gradient dq (head_dim values) of one shifted query row (for
///   Transformer-XL g.u.row(head) += dq). attention_backward calls it once per
///   query row after the path ran, in a fixed order, on every path alike.
///
/// The parameter gradients: `E::gradients` (default `no_gradients` when E has
/// none), `G make_gradients() const` (zeros of the right shape; default `G{}`)
/// and `void check_gradients(char const* where, G const& g) const` (throws
/// posenc::error when g does not fit the encoder; default: nothing to check).
/// G is a value type with `void set_zero()` and `G& operator+=(G const&)`
/// (elementwise): a kernel that runs in parallel gives each task a zeroed copy
/// of the caller's G and adds the copies into it in task order, so results do
/// not depend on the thread count. Hooks add into g (never assign), so one G
/// can gather the gradients of several calls. A G with tensors also has
/// `void check_same_shape(char const* where, G const& other) const` (throws
/// posenc::error naming the first tensor whose shape differs); its
/// operator+= calls it before adding anything. gradient_set (below) gives
/// these members from one list of the tensors; the library's encoders use it.
///
/// Every tensor of a G is a `gradient_tensor<C>` (C = the encoder's
/// compute_type, or T): a row-major Eigen matrix of exactly its parameter's
/// shape, in the parameter's memory order, so `param -= lr * g.x`, or one
/// loop over `.data()` of both, is an optimiser step. Every G (no_gradients
/// included) has `template <class F> void for_each_tensor(F&& f)` and a const
/// overload, calling `f(char const* name, gradient_tensor<C>& t)` (const& in
/// the const one) for each of its tensors in a fixed order, the name being
/// the member's:
///
/// | encoder        | tensors visited, in order (shape)                                  |
/// |----------------|--------------------------------------------------------------------|
/// | alibi          | "slopes" (heads, 1); (0 x 0) after make_gradients(false)           |
/// | t5_bias        | "table" (num_buckets, heads)                                       |
/// | clipped_bias   | "table" (2 max_distance + 1, heads)                                |
/// | shaw           | "key" (2 max_distance + 1, head_dim), "value" (the same, or        |
/// |                |   (0 x 0) without value embeddings)                                |
/// | learned        | "table" (rows, d_model), table()'s layout                          |
/// | transformer_xl | "u" (heads, head_dim), "v" (heads, head_dim), "r" (heads x (2      |
/// |                |   distance_limit + 1), head_dim), d(R) as the encoder tabulates it |
/// |                |   (r_gradient / w_r_gradient give it in r's or W_R's shape)        |
/// | compose<E...>  | each part's tensors, part 0 first, with the part's own names (two  |
/// |                |   parts may both pass "table": the visit order tells them apart)   |
/// | the others     | nothing: none, rope, sinusoidal (no_gradients)                     |
///
/// f is called with every tensor, empty ones included (so the sequence of
/// names does not depend on options); a generic optimiser or a binding pairs
/// them with the parameters by that order. In a compose whose parts differ in
/// C, f must take each C (a generic lambda does).
template <class E>
struct encoder_traits;

/// One tensor of an encoder's parameter gradients (see encoder_traits): a
/// row-major matrix of its parameter's shape. The same type as
/// relative_table<C> (posenc/encoding/bias_kernels.hpp), the tables the
/// relative encoders take.
template <class C>
using gradient_tensor = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace detail {
/// The element type as it appears in an encoder_identity: "float", "double",
/// "half" (IEEE binary16) or "bfloat16", else the type's implementation name.
template <class T>
char const* element_name() noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return "float";
  } else if constexpr (std::is_same_v<T, double>) {
    return "double";
  } else if constexpr (sizeof(T) == 2 && std::numeric_limits<T>::is_specialized &&
                       std::numeric_limits<T>::digits == 11) {
    return "half";
  } else if constexpr (sizeof(T) == 2 && std::numeric_limits<T>::is_specialized &&
                       std::numeric_limits<T>::digits == 8) {
    return "bfloat16";
  } else {
    return typeid(T).name();
  }
}
}  // namespace detail

/// The parameter gradients of an encoder without trainable parameters.
struct no_gradients {
  void set_zero() noexcept {}
  no_gradients& operator+=(no_gradients const&) noexcept { return *this; }
  /// Visits nothing (no tensors).
  template <class F>
  void for_each_tensor(F&&) noexcept {}
  template <class F>
  void for_each_tensor(F&&) const noexcept {}
};

/// A per-head relative-key table by distance d = p_i - p_j, transposed:
/// the term of (q, d) is bias[zero + d] + sum_t q[t] * keys[t * stride + zero + d],
/// for zero + d in [0, count).
template <class T>
struct distance_columns {
  T const* keys = nullptr;  // (head_dim, stride)
  T const* bias = nullptr;  // (count)
  index_t stride = 0, zero = 0, count = 0;
};

namespace detail {

template <class E, class = void>
struct has_encoder_traits : std::false_type {};
template <class E>
struct has_encoder_traits<E, std::void_t<decltype(sizeof(encoder_traits<E>))>> : std::true_type {};

/// Stand-in used after the static_assert so that one error is reported, not a cascade.
struct no_traits {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = false;
};

}  // namespace detail

/// True when encoder_traits<E> is specialized.
template <class E>
inline constexpr bool has_encoder_traits_v = detail::has_encoder_traits<std::remove_cv_t<E>>::value;

/// encoder_traits<E>, or a compile error that says what to do.
template <class E>
struct checked_encoder_traits
    : std::conditional_t<has_encoder_traits_v<E>, encoder_traits<std::remove_cv_t<E>>, detail::no_traits> {
  static_assert(has_encoder_traits_v<E>,
                "posenc::encoder_traits: E is not an encoder; specialize posenc::encoder_traits<E> with "
                "adds_to_embeddings, rotates_queries_keys, biases_scores, relative_key_value and "
                "is_relative (see posenc/encoding/traits.hpp)");
};

namespace detail {
template <class E, class = void>
struct has_reserved_for : std::false_type {};
template <class E>
struct has_reserved_for<E, std::void_t<decltype(bool(std::declval<E const&>().reserved_for(index_t{1})))>>
    : std::true_type {};

template <class E, class = void>
struct has_shift_invariant : std::false_type {};
template <class E>
struct has_shift_invariant<E, std::void_t<decltype(bool(std::declval<E const&>().shift_invariant()))>>
    : std::true_type {};

template <class E, class T, class = void>
struct has_headed_score_row : std::false_type {};
template <class E, class T>
struct has_headed_score_row<E, T,
                            std::void_t<decltype(std::declval<E const&>().score_row(
                                index_t{}, std::declval<T const*>(), index_t{}, index_t{}, index_t{},
                                std::declval<T>(), std::declval<T*>()))>> : std::true_type {};

template <class E, class T, class = void>
struct has_content_bias : std::false_type {};
template <class E, class T>
struct has_content_bias<E, T,
                        std::enable_if_t<std::is_convertible_v<
                            decltype(std::declval<E const&>().content_bias(index_t{})), T const*>>>
    : std::true_type {};

template <class E, class T, class = void>
struct has_distance_columns : std::false_type {};
template <class E, class T>
struct has_distance_columns<E, T,
                            std::enable_if_t<std::is_same_v<decltype(std::declval<E const&>().columns(index_t{})),
                                                            distance_columns<T>>>> : std::true_type {};

template <class E, class = void>
struct has_distance_limit : std::false_type {};
template <class E>
struct has_distance_limit<E, std::void_t<decltype(index_t(std::declval<E const&>().distance_limit()))>>
    : std::true_type {};

template <class E, class = void>
struct has_memory_length : std::false_type {};
template <class E>
struct has_memory_length<E, std::void_t<decltype(index_t(std::declval<E const&>().memory_length()))>>
    : std::true_type {};

/// enc.shift_invariant() when E has it, else false.
template <class E>
bool bias_shift_invariant(E const& enc) noexcept {
  if constexpr (has_shift_invariant<E>::value)
    return enc.shift_invariant();
  else
    return (void)enc, false;
}

/// enc.reserved_for(length) when E has it, else false.
template <class E>
bool rotation_reserved(E const& enc, index_t length) {
  if constexpr (has_reserved_for<E>::value)
    return enc.reserved_for(length);
  else
    return (void)enc, (void)length, false;
}
}  // namespace detail

/// @name Backward hooks and parameter gradients (see the table at encoder_traits)
/// @{
namespace detail {
template <class E, class = void>
struct encoder_gradients {
  using type = no_gradients;
};
template <class E>
struct encoder_gradients<E, std::void_t<typename E::gradients>> {
  using type = typename E::gradients;
};

template <class E, class = void>
struct has_make_gradients : std::false_type {};
template <class E>
struct has_make_gradients<E, std::void_t<decltype(std::declval<E const&>().make_gradients())>> : std::true_type {};

template <class E, class G, class = void>
struct has_check_gradients : std::false_type {};
template <class E, class G>
struct has_check_gradients<E, G, std::void_t<decltype(std::declval<E const&>().check_gradients(
                                     std::declval<char const*>(), std::declval<G const&>()))>> : std::true_type {};
}  // namespace detail

/// The type that holds encoder E's parameter gradients (`no_gradients` when E has none).
template <class E>
using encoder_gradients_t = typename detail::encoder_gradients<std::remove_cv_t<E>>::type;

/// Zeroed parameter gradients for `enc`: enc.make_gradients() when E has it, else {}.
template <class E>
encoder_gradients_t<E> make_gradients(E const& enc) {
  if constexpr (detail::has_make_gradients<E>::value)
    return enc.make_gradients();
  else
    return (void)enc, encoder_gradients_t<E>{};
}

namespace detail {
/// enc.check_gradients(where, g) when E has it (throws when g does not fit enc).
template <class E>
void check_encoder_gradients(char const* where, E const& enc, encoder_gradients_t<E> const& g) {
  if constexpr (has_check_gradients<E, encoder_gradients_t<E>>::value)
    enc.check_gradients(where, g);
  else
    (void)where, (void)enc, (void)g;
}

template <class A, class = void>
struct has_rows_cols : std::false_type {};
template <class A>
struct has_rows_cols<A, std::void_t<decltype(std::declval<A const&>().rows()), decltype(std::declval<A const&>().cols())>>
    : std::true_type {};
template <class A, class = void>
struct is_eigen_vector : std::false_type {};
template <class A>
struct is_eigen_vector<A, std::enable_if_t<A::IsVectorAtCompileTime>> : std::true_type {};

/// Throws unless `other` has the shape of `mine` (rows x cols for a matrix,
/// the count for a vector), naming it `other.<name>`: operator+= of gradients.
template <class A>
void check_same_gradient_shape(char const* where, char const* name, A const& mine, A const& other) {
  if constexpr (has_rows_cols<A>::value && !is_eigen_vector<A>::value)
    require(other.rows() == mine.rows() && other.cols() == mine.cols(), where, "other.", name, " shape is (",
            other.rows(), ", ", other.cols(), "), expected (", mine.rows(), ", ", mine.cols(), ") (this one's)");
  else
    require(other.size() == mine.size(), where, "other.", name, " has ", other.size(), " values, expected ",
            mine.size(), " (this one's)");
}

}  // namespace detail

/// An encoder's parameter gradients built from the list of its tensors, as
/// encoder_traits asks of them: set_zero, check_same_shape, operator+= and
/// for_each_tensor. M holds the tensors (gradient_tensor members, so that a
/// gradient_set<M> is brace-initialised like M) and names them once:
/// `template <class F, class... G> static void each(F&& f, G&... g)` calls
/// `f(name, g.tensor...)` for each tensor in order; `M::add_where` names
/// operator+= in its messages ("posenc::t5_bias::gradients::operator+=").
template <class M>
struct gradient_set : M {
  void set_zero() {
    M::each([](char const*, auto& t) { t.setZero(); }, *this);
  }
  /// Throws unless o's tensors have these tensors' shapes (naming the first that differs).
  void check_same_shape(char const* where, gradient_set const& o) const {
    M::each(
        [&](char const* name, auto const& a, auto const& b) { detail::check_same_gradient_shape(where, name, a, b); },
        *this, o);
  }
  /// Adds o elementwise (throws first when the shapes differ).
  gradient_set& operator+=(gradient_set const& o) {
    check_same_shape(M::add_where, o);
    M::each([](char const*, auto& a, auto const& b) { a += b; }, *this, o);
    return *this;
  }
  /// f(name, tensor) for each tensor, in M's order (see encoder_traits).
  template <class F>
  void for_each_tensor(F&& f) {
    M::each(f, *this);
  }
  template <class F>
  void for_each_tensor(F&& f) const {
    M::each(f, *this);
  }
};

namespace detail {

template <class G, class = void>
struct has_check_same_shape : std::false_type {};
template <class G>
struct has_check_same_shape<G, std::void_t<decltype(std::declval<G const&>().check_same_shape(
                                   std::declval<char const*>(), std::declval<G const&>()))>> : std::true_type {};

/// mine.check_same_shape(where, other) when G has it (gradients without tensors have nothing to check).
template <class G>
void check_same_encoder_gradients(char const* where, G const& mine, G const& other) {
  if constexpr (has_check_same_shape<G>::value)
    mine.check_same_shape(where, other);
  else
    (void)where, (void)mine, (void)other;
}

template <class E, class T, class = void>
struct has_add_to_backward_hook : std::false_type {};
template <class E, class T>
struct has_add_to_backward_hook<
    E, T,
    std::void_t<decltype(std::declval<E const&>().add_to_backward(
        std::declval<token_view<const T>>(), std::declval<position_span>(), std::declval<encoder_gradients_t<E>&>()))>>
    : std::true_type {};

template <class E, class T, class = void>
struct has_rotate_transpose_hook : std::false_type {};
template <class E, class T>
struct has_rotate_transpose_hook<E, T, std::void_t<decltype(std::declval<E const&>().rotate_transpose(
                                           std::declval<view<T>>(), std::declval<position_span>(), index_t{}))>>
    : std::true_type {};

template <class E, class T, class = void>
struct has_bias_row_backward_hook : std::false_type {};
template <class E, class T>
struct has_bias_row_backward_hook<
    E, T,
    std::void_t<decltype(std::declval<E const&>().bias_row_backward(
        index_t{}, index_t{}, index_t{}, index_t{}, std::declval<T const*>(), std::declval<encoder_gradients_t<E>&>()))>>
    : std::true_type {};

template <class E, class T, class = void>
struct has_relative_key_value_backward_hooks : std::false_type {};
template <class E, class T>
struct has_relative_key_value_backward_hooks<
    E, T,
    std::void_t<decltype(std::declval<E const&>().score_row_backward(
                    std::declval<T const*>(), index_t{}, index_t{}, index_t{}, std::declval<T>(),
                    std::declval<T const*>(), std::declval<T*>(), std::declval<encoder_gradients_t<E>&>())),
                decltype(std::declval<E const&>().value_row_backward(
                    std::declval<T const*>(), std::declval<T const*>(), index_t{}, index_t{}, index_t{},
                    std::declval<T*>(), std::declval<encoder_gradients_t<E>&>()))>> : std::true_type {};

template <class E, class T, class = void>
struct has_headed_relative_key_value_backward_hooks : std::false_type {};
template <class E, class T>
struct has_headed_relative_key_value_backward_hooks<
    E, T,
    std::void_t<decltype(std::declval<E const&>().score_row_backward(
                    index_t{}, std::declval<T const*>(), index_t{}, index_t{}, index_t{}, std::declval<T>(),
                    std::declval<T const*>(), std::declval<T*>(), std::declval<encoder_gradients_t<E>&>())),
                decltype(std::declval<E const&>().value_row_backward(
                    std::declval<T const*>(), std::declval<T const*>(), index_t{}, index_t{}, index_t{},
                    std::declval<T*>(), std::declval<encoder_gradients_t<E>&>()))>> : std::true_type {};

template <class E, class T, class = void>
struct has_content_bias_backward_hook : std::false_type {};
template <class E, class T>
struct has_content_bias_backward_hook<
    E, T,
    std::void_t<decltype(std::declval<E const&>().content_bias_backward(
        index_t{}, std::declval<T const*>(), std::declval<encoder_gradients_t<E>&>()))>> : std::true_type {};

/// True when E has a content bias (any element type): the kernels shift its queries.
template <class E, class = void>
struct has_any_content_bias : std::false_type {};
template <class E>
struct has_any_content_bias<E, std::void_t<decltype(std::declval<E const&>().content_bias(index_t{}))>>
    : std::true_type {};

/// The first backward hook encoder E lacks for element type T, for the places its traits say it acts.
enum class backward_problem {
  none,
  add_to_backward,
  rotate_transpose,
  bias_row_backward,
  relative_key_value_backward,
  content_bias_backward
};

/// Checks encoder E (with encoder_traits) for its backward hooks; compose.hpp
/// specializes it to check every part.
template <class E, class T>
struct encoder_backward {
  using traits = encoder_traits<E>;
  static constexpr backward_problem problem =
      traits::adds_to_embeddings && !has_add_to_backward_hook<E, T>::value ? backward_problem::add_to_backward
      : traits::rotates_queries_keys && !has_rotate_transpose_hook<E, T>::value ? backward_problem::rotate_transpose
      : traits::biases_scores && !has_bias_row_backward_hook<E, T>::value ? backward_problem::bias_row_backward
      : traits::relative_key_value && !has_relative_key_value_backward_hooks<E, T>::value &&
              !has_headed_relative_key_value_backward_hooks<E, T>::value
          ? backward_problem::relative_key_value_backward
      : has_content_bias<E, T>::value && !has_content_bias_backward_hook<E, T>::value
          ? backward_problem::content_bias_backward
          : backward_problem::none;
};

/// encoder_backward<E, T>::problem; `none` for a type without encoder_traits.
template <class E, class T>
constexpr backward_problem encoder_backward_problem() {
  if constexpr (has_encoder_traits<std::remove_cv_t<E>>::value)
    return encoder_backward<std::remove_cv_t<E>, std::remove_cv_t<T>>::problem;
  else
    return backward_problem::none;
}
}  // namespace detail

/// True when encoder E has every backward hook its traits call for, for element type T.
template <class E, class T>
inline constexpr bool has_backward_v = detail::encoder_backward_problem<E, T>() == detail::backward_problem::none;
/// @}

/// @name The encoder contract, checked where an encoder enters the library
///
/// posenc::attention and multi_head_attention check, at compile time and for
/// the element type T of their views, that the encoder keeps the contract of
/// the table above, and say in one sentence what is missing instead of an
/// overload error from deep inside a kernel:
/// - `E::value_type`, when E declares one, is T (an encoder without it, such as
///   none, compose or a generic test encoder, must work with any T); an
///   encoder with a 16-bit table declares `compute_type` (float), which is
///   compared instead;
/// - `index_t max_positions() const` exists;
/// - for each trait that is true, its hooks are callable with the argument
///   types in the table (T* for T, views of T), const, with results convertible
///   to the types shown.
/// compose<E...> keeps the contract when every part keeps it for its own traits.
/// @{
namespace detail {

template <class E, class = void>
struct declared_value_type {
  using type = void;  // none declared: any element type
};
template <class E>
struct declared_value_type<E, std::void_t<typename E::value_type>> {
  using type = typename E::value_type;
};
template <class E, class = void>
struct declared_compute_type : declared_value_type<E> {};
/// An encoder whose table is stored in 16 bits declares `compute_type` (float):
/// its hooks take views and pointers of that type.
template <class E>
struct declared_compute_type<E, std::void_t<typename E::compute_type>> {
  using type = typename E::compute_type;
};

template <class E, class = void>
struct has_max_positions_hook : std::false_type {};
template <class E>
struct has_max_positions_hook<E, std::void_t<decltype(index_t(std::declval<E const&>().max_positions()))>>
    : std::true_type {};

template <class E, class T, class = void>
struct has_add_to_hook : std::false_type {};
template <class E, class T>
struct has_add_to_hook<E, T, std::void_t<decltype(std::declval<E const&>().add_to(
                                 std::declval<token_view<T>>(), std::declval<position_span>()))>>
    : std::true_type {};

template <class E, class T, class = void>
struct has_rotate_hook : std::false_type {};
template <class E, class T>
struct has_rotate_hook<E, T, std::void_t<decltype(std::declval<E const&>().rotate(
                                 std::declval<view<T>>(), std::declval<position_span>(), index_t{}))>>
    : std::true_type {};

template <class E, class T, class = void>
struct has_bias_row_hook : std::false_type {};
template <class E, class T>
struct has_bias_row_hook<E, T, std::void_t<decltype(std::declval<E const&>().bias_row(
                                   index_t{}, index_t{}, index_t{}, index_t{}, std::declval<T*>()))>>
    : std::true_type {};

template <class E, class = void>
struct has_heads_hook : std::false_type {};
template <class E>
struct has_heads_hook<E, std::void_t<decltype(index_t(std::declval<E const&>().heads()))>> : std::true_type {};

template <class E, class T, class = void>
struct has_headless_score_row : std::false_type {};
template <class E, class T>
struct has_headless_score_row<E, T,
                              std::void_t<decltype(std::declval<E const&>().score_row(
                                  std::declval<T const*>(), index_t{}, index_t{}, index_t{}, std::declval<T>(),
                                  std::declval<T*>()))>> : std::true_type {};

template <class E, class T, class = void>
struct has_relative_key_value_hooks : std::false_type {};
template <class E, class T>
struct has_relative_key_value_hooks<
    E, T,
    std::void_t<std::enable_if_t<has_headless_score_row<E, T>::value || has_headed_score_row<E, T>::value>,
                decltype(std::declval<E const&>().value_row(std::declval<T const*>(), index_t{}, index_t{},
                                                            index_t{}, std::declval<T*>())),
                decltype(bool(std::declval<E const&>().has_values())),
                decltype(index_t(std::declval<E const&>().head_dim()))>> : std::true_type {};

/// The first broken clause of the encoder contract, in the order the checks report them.
enum class contract_problem { none, value_type, max_positions, add_to, rotate, bias_row, heads, relative_key_value };

/// Checks encoder E (with encoder_traits) for element type T; compose.hpp
/// specializes it to check every part.
template <class E, class T>
struct encoder_contract {
  using traits = encoder_traits<E>;
  using declared = typename declared_compute_type<E>::type;
  static constexpr contract_problem problem =
      !(std::is_void<declared>::value || std::is_same<declared, T>::value) ? contract_problem::value_type
      : !has_max_positions_hook<E>::value                                   ? contract_problem::max_positions
      : traits::adds_to_embeddings && !has_add_to_hook<E, T>::value         ? contract_problem::add_to
      : traits::rotates_queries_keys && !has_rotate_hook<E, T>::value       ? contract_problem::rotate
      : traits::biases_scores && !has_bias_row_hook<E, T>::value            ? contract_problem::bias_row
      : traits::biases_scores && !has_heads_hook<E>::value                  ? contract_problem::heads
      : traits::relative_key_value && !has_relative_key_value_hooks<E, T>::value
          ? contract_problem::relative_key_value
          : contract_problem::none;
};

/// encoder_contract<E, T>::problem; `none` for a type without encoder_traits
/// (that has its own static_assert).
template <class E, class T>
constexpr contract_problem encoder_contract_problem() {
  if constexpr (has_encoder_traits<std::remove_cv_t<E>>::value)
    return encoder_contract<std::remove_cv_t<E>, std::remove_cv_t<T>>::problem;
  else
    return contract_problem::none;
}

}  // namespace detail

/// True when encoder E keeps the encoder contract for views of element type T.
template <class E, class T>
inline constexpr bool keeps_encoder_contract_v =
    detail::encoder_contract_problem<E, T>() == detail::contract_problem::none;
/// @}

template <class E>
inline constexpr bool adds_to_embeddings_v = checked_encoder_traits<E>::adds_to_embeddings;
template <class E>
inline constexpr bool rotates_queries_keys_v = checked_encoder_traits<E>::rotates_queries_keys;
template <class E>
inline constexpr bool biases_scores_v = checked_encoder_traits<E>::biases_scores;
template <class E>
inline constexpr bool relative_key_value_v = checked_encoder_traits<E>::relative_key_value;
template <class E>
inline constexpr bool is_relative_v = checked_encoder_traits<E>::is_relative;

}  // namespace posenc
