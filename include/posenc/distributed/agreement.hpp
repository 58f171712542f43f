// SPDX-License-Identifier: MIT
// The descriptor the ranks exchange before a ring call, and the check that they agree (same error on every rank).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"

namespace posenc::distributed::detail {

/// FNV-1a over bytes: a cheap fingerprint of options.
class hasher {
 public:
  void add_bytes(void const* p, std::size_t n) noexcept {
    auto const* c = static_cast<unsigned char const*>(p);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ c[i]) * 1099511628211ull;
  }
  void add(std::int64_t x) noexcept { add_bytes(&x, sizeof x); }
  template <class T>
  void add_values(T const* p, std::size_t n) noexcept {
    add_bytes(p, n * sizeof(T));
  }
  std::uint64_t value() const noexcept { return h_; }

 private:
  std::uint64_t h_ = 14695981039346656037ull;
};

/// The bits of a double, as an integer every rank compares exactly.
inline std::int64_t bits_of(double x) noexcept {
  std::int64_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

/// The fields every rank must agree on.
enum class field : int {
  element_size,
  batch,
  q_heads,
  kv_heads,
  head_dim,
  value_dim,
  layout,
  causal,
  sliding_window,
  scale,
  softcap,
  keys_rotated,
  q_offset,
  k_offset,
  key_lengths,
  encoder_type,
  count_
};

/// Name of a field in error messages.
inline char const* field_name(field f) noexcept {
  static char const* const names[] = {"sizeof(T)",           "batch",        "q.heads",     "k.heads",
                                      "q.dim",               "v.dim",        "layout",      "causal",
                                      "sliding_window",      "scale (bits)", "softcap (bits)", "keys_rotated",
                                      "q_positions offset",  "k_positions offset", "key_lengths (hash)",
                                      "encoder type (hash)"};
  return names[static_cast<int>(f)];
}

inline constexpr std::size_t message_chars_v = 400;

/// What one rank sends: the agreed fields, its shard length, the digest of
/// its encoder's identity (second phase), and its error message when its own
/// arguments are bad (empty when not). Trivially copyable: it travels as bytes.
struct descriptor {
  std::int64_t values[static_cast<int>(field::count_)] = {};
  std::int64_t shard_length = 0;
  std::uint64_t encoder_digest = 0;
  char error[message_chars_v] = {};

  std::int64_t get(field f) const noexcept { return values[static_cast<int>(f)]; }
  bool has_error() const noexcept { return error[0] != '\0'; }
  /// Keeps the message (cut to fit).
  void set_error(char const* what) noexcept {
    std::strncpy(error, what, message_chars_v - 1);
    error[message_chars_v - 1] = '\0';
  }
};

/// Every rank's descriptor, in rank order (MPI_Allgather: every rank gets the same list).
inline std::vector<descriptor> exchange(MPI_Comm comm, descriptor const& mine) {
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  std::vector<descriptor> all(static_cast<std::size_t>(ranks));
  MPI_Allgather(&mine, static_cast<int>(sizeof(descriptor)), MPI_BYTE, all.data(), static_cast<int>(sizeof(descriptor)),
                MPI_BYTE, comm);
  return all;
}

/// Throws posenc::error on every rank when a rank reported an error (that rank
/// throws its own message, the others name it) or when a rank's fields differ
/// from rank 0's. Every rank sees the same list, so every rank throws. `w`
/// names the call (posenc::ring_attention or posenc::ring_attention_backward);
/// a rank's own message that names another function gets it in front.
inline void require_agreement(std::vector<descriptor> const& all, int rank, char const* w) {
  if (all[static_cast<std::size_t>(rank)].has_error()) {
    std::string const own = all[static_cast<std::size_t>(rank)].error;
    std::string const prefix = std::string(w) + ":";
    POSENC_THROW(error(own.compare(0, prefix.size(), prefix) == 0 ? own : std::string(w) + ": " + own));
  }
  for (std::size_t r = 0; r < all.size(); ++r)
    posenc::detail::require(!all[r].has_error(), w, "rank ", r, " rejected its arguments (", all[r].error,
                            "), expected every rank to accept them");
  for (int f = 0; f < static_cast<int>(field::count_); ++f)
    for (std::size_t r = 1; r < all.size(); ++r)
      posenc::detail::require(all[r].values[f] == all[0].values[f], w, field_name(static_cast<field>(f)), " is ",
                              all[r].values[f], " on rank ", r, ", expected ", all[0].values[f],
                              " (as on rank 0: every rank passes the same shapes, options and encoder)");
}

/// Throws posenc::error on every rank when a rank's encoder identity digest
/// differs from rank 0's, naming the call, the first such rank, and this
/// rank's own identity text (`mine`). Every rank sees the same list.
inline void require_same_encoder(std::vector<descriptor> const& all, int rank, char const* w, std::string const& mine) {
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r].encoder_digest == all[0].encoder_digest) continue;
    char digests[80];
    std::snprintf(digests, sizeof digests, "#%016llx on rank %zu, #%016llx on rank 0",
                  static_cast<unsigned long long>(all[r].encoder_digest), r,
                  static_cast<unsigned long long>(all[0].encoder_digest));
    posenc::detail::fail(w, "the encoder differs between ranks (identity digest ", digests,
                         "), expected the same encoder with the same parameters on every rank; rank ", rank,
                         " has ", mine);
  }
}

}  // namespace posenc::distributed::detail
