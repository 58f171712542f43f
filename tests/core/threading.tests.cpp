// SPDX-License-Identifier: MIT
// parallel_for visits every index exactly once, serially and on two threads; thread counts resolve.
#include <posenc/core/threading.hpp>

#include <atomic>
#include <memory>
#include <vector>

#include "support/catch.hpp"

namespace core_threading_tests {

using posenc::index_t;

TEST_CASE("threading: resolve_threads clamps to [1, default_threads()]", "[threading]") {
  int const avail = posenc::default_threads();
  REQUIRE(avail >= 1);
  if (!posenc::has_openmp()) CHECK(avail == 1);
  CHECK(posenc::resolve_threads(0) == avail);
  CHECK(posenc::resolve_threads(-3) == avail);
  CHECK(posenc::resolve_threads(1) == 1);
  CHECK(posenc::resolve_threads(2) == (avail < 2 ? avail : 2));
  CHECK(posenc::resolve_threads(100000) == avail);
}

TEST_CASE("threading: parallel_for covers each index exactly once", "[threading]") {
  for (int threads : {1, 2, 0}) {
    for (index_t n : {0, 1, 2, 3, 17, 1000}) {
      auto hits = std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(n > 0 ? n : 1));
      for (index_t i = 0; i < n; ++i) hits[static_cast<std::size_t>(i)] = 0;
      std::atomic<int> calls{0};
      std::atomic<int> bad_thread{0};
      int const t = posenc::resolve_threads(threads);
      posenc::parallel_for(n, threads, [&](index_t i) noexcept {
        if (i >= 0 && i < n) hits[static_cast<std::size_t>(i)].fetch_add(1);
        int const ti = posenc::thread_index();
        if (ti < 0 || ti >= t) bad_thread.fetch_add(1);
        calls.fetch_add(1);
      });
      INFO("threads " << threads << ", n " << n);
      CHECK(calls.load() == n);
      CHECK(bad_thread.load() == 0);
      int wrong = 0;
      for (index_t i = 0; i < n; ++i) wrong += hits[static_cast<std::size_t>(i)].load() != 1;
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("threading: a negative range does nothing", "[threading]") {
  int calls = 0;
  posenc::parallel_for(-5, 2, [&](index_t) noexcept { ++calls; });
  CHECK(calls == 0);
}

TEST_CASE("threading: each index's work lands in its own slot on two threads", "[threading]") {
  // A typical kernel use: one output row per index, written by whichever thread runs it.
  index_t const n = 257;
  std::vector<double> out(static_cast<std::size_t>(n), -1.0);
  posenc::parallel_for(n, 2, [&](index_t i) noexcept {
    double s = 0;
    for (index_t j = 0; j <= i; ++j) s += static_cast<double>(j);
    out[static_cast<std::size_t>(i)] = s;
  });
  int wrong = 0;
  for (index_t i = 0; i < n; ++i) wrong += out[static_cast<std::size_t>(i)] != static_cast<double>(i * (i + 1) / 2);
  CHECK(wrong == 0);
}
}  // namespace core_threading_tests
