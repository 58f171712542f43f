// SPDX-License-Identifier: MIT
// aligned_buffer<T>: an owning, 64-byte aligned, fixed-size array for scratch and tables.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"

namespace posenc {

/// Owning array of trivially copyable T aligned to 64 bytes (a cache line and
/// an AVX-512 register). Zero-initialised.
template <class T>
class aligned_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "posenc::aligned_buffer: T must be trivially copyable; use std::vector for other types");

 public:
  static constexpr std::size_t alignment = 64;

  aligned_buffer() noexcept = default;
  /// n zero elements; throws posenc::error when n < 0 or when n * sizeof(T),
  /// rounded up to the alignment, does not fit index_t.
  explicit aligned_buffer(index_t n) {
    std::size_t const bytes = bytes_for(n);
    size_ = n;
    if (n > 0) {
      data_ = static_cast<T*>(::operator new(bytes, std::align_val_t(alignment)));
      std::memset(static_cast<void*>(data_), 0, bytes);
    }
  }
  /// n elements left uninitialised (scratch that is written before it is read).
  static aligned_buffer uninitialized(index_t n) {
    aligned_buffer b;
    std::size_t const bytes = bytes_for(n);
    b.size_ = n;
    if (n > 0) b.data_ = static_cast<T*>(::operator new(bytes, std::align_val_t(alignment)));
    return b;
  }
  aligned_buffer(aligned_buffer const& o) : aligned_buffer(o.size_) {
    if (size_ > 0) std::memcpy(static_cast<void*>(data_), o.data_, static_cast<std::size_t>(size_) * sizeof(T));
  }
  aligned_buffer(aligned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  aligned_buffer& operator=(aligned_buffer o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~aligned_buffer() {
    if (data_) ::operator delete(static_cast<void*>(data_), std::align_val_t(alignment));
  }

  T* data() noexcept { return data_; }
  T const* data() const noexcept { return data_; }
  index_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T& operator[](index_t i) noexcept { return data_[i]; }
  T const& operator[](index_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  T const* begin() const noexcept { return data_; }
  T const* end() const noexcept { return data_ + size_; }

 private:
  // Bytes to allocate for n elements: n * sizeof(T) rounded up to a multiple
  // of the alignment, checked for index_t overflow before anything is allocated.
  static std::size_t bytes_for(index_t n) {
    char const* w = "posenc::aligned_buffer";
    detail::require(n >= 0, w, "n is ", n, ", expected >= 0");
    constexpr index_t a = static_cast<index_t>(alignment), size = static_cast<index_t>(sizeof(T));
    index_t const bytes = detail::checked_mul(w, n, size, "n x sizeof(T)");
    return static_cast<std::size_t>(detail::checked_add(w, bytes, a - 1, "n x sizeof(T) + alignment - 1") / a * a);
  }

  T* data_ = nullptr;
  index_t size_ = 0;
};

}  // namespace posenc
