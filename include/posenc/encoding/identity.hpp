// SPDX-License-Identifier: MIT
// encoder_identity: what an encoder computes, as text a person reads and a 64-bit digest.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "posenc/core/error.hpp"

namespace posenc {

/// An encoder's identity: its kind and every parameter that changes what it
/// computes, tables by a digest of their contents. Two encoders with equal
/// identities give the same numbers; change any one parameter and the identity
/// changes. Caches keep the identity of the encoder that rotated their keys
/// (a later call with another one is an error naming both), and ring ranks
/// compare theirs before attending.
///
/// Built with a kind and then one add() per parameter, in a fixed order:
///
///     encoder_identity id("rope");
///     id.add("head_dim", 128).add("base", 10000.0).add("layout", "half");
///
/// text() is then `rope(head_dim 128, base 10000, layout half)`. Floating
/// values enter the digest bit for bit (and the text with enough digits to
/// tell them apart); tables enter as their shape and a digest of their bytes.
class encoder_identity {
 public:
  encoder_identity() = default;
  explicit encoder_identity(std::string kind) : kind_(std::move(kind)) { mix_text(kind_); }

  /// An integer parameter (an extent, a count, a bucket number).
  template <class I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
  encoder_identity& add(char const* name, I value) {
    auto const v = static_cast<std::int64_t>(value);
    mix_text(name);
    mix_bytes(&v, sizeof v);
    return append(name, std::to_string(v));
  }
  encoder_identity& add(char const* name, bool value) { return add(name, value ? "true" : "false"); }
  encoder_identity& add(char const* name, double value) {
    mix_text(name);
    mix_bytes(&value, sizeof value);
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    return append(name, buf);
  }
  encoder_identity& add(char const* name, float value) {
    mix_text(name);
    mix_bytes(&value, sizeof value);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(value));
    return append(name, buf);
  }
  /// A named choice (a layout, a scaling kind, a mode).
  encoder_identity& add(char const* name, char const* value) {
    mix_text(name);
    mix_text(value);
    return append(name, value);
  }
  /// A table of rows x cols values (any trivially copyable element type): its
  /// shape and a digest of its bytes, read row by row with row_stride elements
  /// between row starts (row_stride = cols for a packed table).
  template <class T>
  encoder_identity& add_table(char const* name, T const* data, std::int64_t rows, std::int64_t cols,
                              std::int64_t row_stride) {
    static_assert(std::is_trivially_copyable<T>::value, "posenc::encoder_identity::add_table: trivially copyable values");
    detail::require(rows >= 0 && cols >= 0 && (rows == 0 || cols == 0 || data != nullptr),
                    "posenc::encoder_identity::add_table", "table '", name, "' is ", rows, " x ", cols,
                    " at ", static_cast<void const*>(data), ", expected non-negative extents and data for a non-empty table");
    mix_text(name);
    mix_bytes(&rows, sizeof rows);
    mix_bytes(&cols, sizeof cols);
    std::uint64_t table = offset;
    for (std::int64_t r = 0; r < rows; ++r) table = fnv(table, data + r * row_stride, static_cast<std::size_t>(cols) * sizeof(T));
    mix_bytes(&table, sizeof table);
    char buf[80];
    std::snprintf(buf, sizeof buf, "%lld x %lld #%016llx", static_cast<long long>(rows), static_cast<long long>(cols),
                  static_cast<unsigned long long>(table));
    return append(name, buf);
  }
  /// A part that is itself an identity (a scaling, a member of a composition).
  encoder_identity& add(char const* name, encoder_identity const& part) {
    mix_text(name);
    mix_bytes(&part.digest_, sizeof part.digest_);
    return append(name, part.text());
  }

  /// `kind(name value, ...)`, every parameter in the order added.
  std::string text() const { return kind_ + "(" + params_ + ")"; }
  std::uint64_t digest() const noexcept { return digest_; }
  bool empty() const noexcept { return kind_.empty(); }

  friend bool operator==(encoder_identity const& a, encoder_identity const& b) {
    return a.digest_ == b.digest_ && a.kind_ == b.kind_ && a.params_ == b.params_;
  }
  friend bool operator!=(encoder_identity const& a, encoder_identity const& b) { return !(a == b); }

 private:
  static constexpr std::uint64_t offset = 14695981039346656037ull, prime = 1099511628211ull;
  static std::uint64_t fnv(std::uint64_t h, void const* p, std::size_t n) noexcept {
    auto const* b = static_cast<unsigned char const*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * prime;
    return h;
  }
  void mix_bytes(void const* p, std::size_t n) noexcept { digest_ = fnv(digest_, p, n); }
  void mix_text(char const* s) noexcept { mix_bytes(s, std::strlen(s) + 1); }
  void mix_text(std::string const& s) noexcept { mix_bytes(s.c_str(), s.size() + 1); }
  encoder_identity& append(char const* name, std::string const& value) {
    if (!params_.empty()) params_ += ", ";
    params_ += name;
    params_ += ' ';
    params_ += value;
    return *this;
  }

  std::string kind_, params_;
  std::uint64_t digest_ = offset;
};

namespace detail {
template <class E, class = void>
struct has_identity : std::false_type {};
template <class E>
struct has_identity<E, std::void_t<decltype(std::declval<E const&>().identity())>> : std::true_type {};
template <class E, class = void>
struct has_rotation_identity : std::false_type {};
template <class E>
struct has_rotation_identity<E, std::void_t<decltype(std::declval<E const&>().rotation_identity())>> : std::true_type {};
}  // namespace detail

/// enc.identity(). An encoder without that member (one defined outside the
/// library) is known by its type alone: its parameters are not compared.
/// Returns a reference when the encoder keeps its identity (rope, compose's
/// rotation), so that a check per decode step builds nothing.
template <class E>
decltype(auto) identity_of(E const& enc) {
  if constexpr (detail::has_identity<E>::value) {
    return enc.identity();
  } else {
    (void)enc;
    encoder_identity id(typeid(E).name());
    id.add("parameters", "not compared (no identity() member)");
    return id;
  }
}

/// The identity of what rotates queries and keys: enc.rotation_identity()
/// when E has it (compose: its rotating parts only, so a cache filled through
/// RoPE + ALiBi serves a call whose ALiBi differs), else identity_of(enc).
template <class E>
decltype(auto) rotation_identity_of(E const& enc) {
  if constexpr (detail::has_rotation_identity<E>::value) {
    return enc.rotation_identity();
  } else {
    return identity_of(enc);
  }
}

}  // namespace posenc
