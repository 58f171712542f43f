// SPDX-License-Identifier: MIT
// Index type and a minimal non-owning contiguous span (C++17 has no std::span).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace posenc {

/// Signed index type for sizes, strides and positions.
using index_t = std::int64_t;

/// A non-owning (pointer, size) pair.
template <class T>
class span {
 public:
  constexpr span() noexcept = default;
  constexpr span(T* data, index_t size) noexcept : data_(data), size_(size) {}
  template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  span(std::vector<U> const& v) noexcept  // NOLINT: implicit on purpose
      : data_(v.data()), size_(static_cast<index_t>(v.size())) {}
  template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  span(std::vector<U>& v) noexcept  // NOLINT: implicit on purpose
      : data_(v.data()), size_(static_cast<index_t>(v.size())) {}
  template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  constexpr span(span<U> s) noexcept : data_(s.data()), size_(s.size()) {}  // NOLINT

  constexpr T* data() const noexcept { return data_; }
  constexpr index_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T& operator[](index_t i) const noexcept { return data_[i]; }
  constexpr T* begin() const noexcept { return data_; }
  constexpr T* end() const noexcept { return data_ + size_; }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

}  // namespace posenc
