// SPDX-License-Identifier: MIT
// t5_bias: the bucket function against docs/formulas.md 4.1, bias against the table, bias_row against bias.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <posenc/core/half.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <random>
#include <vector>

#include "support/catch.hpp"
#include "support/encoder_runs.hpp"
#include "support/random.hpp"

namespace encoding_t5_bias_tests {

using posenc_test::random_buffer;
using posenc_test::as_table;
using posenc_test::bias_row_mismatches;

using posenc::index_t;
using posenc::t5_bias;
using posenc::t5_bias_params;

static_assert(posenc::biases_scores_v<t5_bias<float>> && posenc::is_relative_v<t5_bias<double>>);
static_assert(!posenc::relative_key_value_v<t5_bias<float>> && !posenc::adds_to_embeddings_v<t5_bias<float>>);

namespace {

// docs/formulas.md 4.1 written out once more, straight from the text.
index_t reference_bucket(index_t delta, bool bidirectional, index_t nb, index_t md) {
  index_t half = nb, offset = 0, n = 0;
  if (bidirectional) {
    half = nb / 2;
    offset = delta > 0 ? half : 0;
    n = delta < 0 ? -delta : delta;
  } else {
    n = delta < 0 ? -delta : 0;
  }
  index_t const e = half / 2;
  if (n < e) return offset + n;
  double const de = static_cast<double>(e);
  double const large =
      std::log(static_cast<double>(n) / de) / std::log(static_cast<double>(md) / de) * static_cast<double>(half - e);
  return offset + std::min<index_t>(half - 1, e + static_cast<index_t>(std::trunc(large)));
}

}  // namespace

TEST_CASE("t5_bias: bucket boundaries of the defaults (docs/formulas.md 4.1)", "[t5]") {
  t5_bias<float> bi({1, true}, 0);
  // Per side: 0..7 exact, 8-11 -> 8, 12-15 -> 9, 16-22 -> 10, 23-31 -> 11,
  // 32-45 -> 12, 46-63 -> 13, 64-90 -> 14, >= 91 -> 15; the future side adds 16.
  index_t const firsts[] = {8, 12, 16, 23, 32, 46, 64, 91};
  for (index_t n = 0; n < 8; ++n) {
    CHECK(bi.bucket(-n) == n);
    if (n > 0) CHECK(bi.bucket(n) == 16 + n);
  }
  for (index_t b = 0; b < 8; ++b) {
    index_t const lo = firsts[b], hi = b + 1 < 8 ? firsts[b + 1] - 1 : 300;
    for (index_t n : {lo, hi}) {
      CHECK(bi.bucket(-n) == 8 + b);
      CHECK(bi.bucket(n) == 24 + b);
    }
  }
  CHECK(bi.bucket(0) == 0);
  // Unidirectional: 0..15 exact, 16-18 -> 16, 19-20 -> 17, 99-112 -> 30, >= 113 -> 31; future -> 0.
  t5_bias<float> uni({1, false}, 0);
  for (index_t n = 0; n < 16; ++n) CHECK(uni.bucket(-n) == n);
  CHECK(uni.bucket(-16) == 16);
  CHECK(uni.bucket(-18) == 16);
  CHECK(uni.bucket(-19) == 17);
  CHECK(uni.bucket(-20) == 17);
  CHECK(uni.bucket(-99) == 30);
  CHECK(uni.bucket(-112) == 30);
  CHECK(uni.bucket(-113) == 31);
  CHECK(uni.bucket(1) == 0);
  CHECK(uni.bucket(5000) == 0);
  // Far beyond max_distance, and at the extremes of index_t.
  index_t const big = std::numeric_limits<index_t>::max();
  CHECK(bi.bucket(big) == 31);
  CHECK(bi.bucket(-big) == 15);
  CHECK(uni.bucket(-big) == 31);
  CHECK(uni.bucket(big) == 0);
}

TEST_CASE("t5_bias: bucket equals the formula for many settings", "[t5]") {
  struct setting {
    bool bi;
    index_t nb, md;
  };
  setting const settings[] = {{true, 32, 128},  {true, 4, 2},  {true, 4, 3},   {true, 10, 50}, {true, 64, 1000},
                              {false, 32, 128}, {false, 2, 2}, {false, 7, 40}, {false, 3, 5},  {false, 48, 100000}};
  for (auto s : settings) {
    t5_bias<double> t({2, s.bi, s.nb, s.md}, 1);
    for (index_t d = -3000; d <= 3000; ++d) {
      INFO("bi " << s.bi << " N " << s.nb << " D " << s.md << " delta " << d);
      REQUIRE(t.bucket(d) == reference_bucket(d, s.bi, s.nb, s.md));
    }
  }
}

TEMPLATE_TEST_CASE("t5_bias: bias is the table entry of the bucket", "[t5]", float, double) {
  using T = TestType;
  index_t const nb = 32, heads = 3;
  posenc::relative_table<T> table(nb, heads);
  for (index_t b = 0; b < nb; ++b)
    for (index_t h = 0; h < heads; ++h) table(b, h) = static_cast<T>(100 * h + b);  // encodes (bucket, head)
  for (bool bi : {true, false}) {
    t5_bias<T> t({heads, bi}, table);
    for (index_t h = 0; h < heads; ++h)
      for (index_t qp = 0; qp < 300; qp += 17)
        for (index_t kp = 0; kp < 300; kp += 3) {
          CHECK(t.bias(h, qp, kp) == static_cast<T>(100 * h + reference_bucket(kp - qp, bi, nb, 128)));
          CHECK(t.weight(t.bucket(kp - qp), h) == t.bias(h, qp, kp));
        }
  }
  // A column-major matrix and a Map over a plain array give the same encoder.
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> col = table;
  std::vector<T> flat(table.data(), table.data() + nb * heads);
  t5_bias<T> a({heads}, table), b({heads}, col),
      c({heads}, Eigen::Map<const posenc::relative_table<T>>(flat.data(), nb, heads));
  for (index_t h = 0; h < heads; ++h)
    for (index_t kp = 0; kp < 200; kp += 7) {
      CHECK(a.bias(h, 100, kp) == b.bias(h, 100, kp));
      CHECK(a.bias(h, 100, kp) == c.bias(h, 100, kp));
    }
}

TEMPLATE_TEST_CASE("t5_bias: bias_row equals bias for random rows, heads and offsets", "[t5]", float, double) {
  using T = TestType;
  std::mt19937_64 gen(5);
  struct setting {
    bool bi;
    index_t nb, md;
  };
  setting const settings[] = {{true, 32, 128}, {false, 32, 128}, {true, 4, 2},
                              {false, 2, 2},   {true, 16, 20},   {false, 9, 1000}};
  for (auto s : settings) {
    t5_bias<T> t({5, s.bi, s.nb, s.md}, 99, 1.0);
    for (int trial = 0; trial < 300; ++trial) {
      index_t const count = std::uniform_int_distribution<index_t>(0, 400)(gen);
      index_t const base = trial % 3 == 0 ? 1000000000 : 0;  // far KV-cache positions
      index_t const q_pos = base + std::uniform_int_distribution<index_t>(0, 500)(gen);
      index_t const k_first = base + std::uniform_int_distribution<index_t>(0, 500)(gen);
      index_t const head = std::uniform_int_distribution<index_t>(0, 4)(gen);
      std::vector<T> row(static_cast<std::size_t>(count + 2), T(0));
      row[static_cast<std::size_t>(count)] = row[static_cast<std::size_t>(count + 1)] = T(-5);
      t.bias_row(head, q_pos, k_first, count, row.data());
      for (index_t j = 0; j < count; ++j) {
        INFO("N " << s.nb << " D " << s.md << " head " << head << " q " << q_pos << " k " << k_first + j);
        REQUIRE(row[static_cast<std::size_t>(j)] == t.bias(head, q_pos, k_first + j));
      }
      CHECK(row[static_cast<std::size_t>(count)] == T(-5));
      CHECK(row[static_cast<std::size_t>(count + 1)] == T(-5));
    }
  }
  // Tiles of 16 keys across a row, as the fused kernel calls it: tiles wholly in
  // the far past, wholly in the far future, and straddling run boundaries.
  for (bool bi : {true, false}) {
    t5_bias<T> t({2, bi}, 6, 1.0);
    for (index_t q_pos : {0, 5, 90, 91, 92, 112, 113, 114, 250, 400}) {
      std::vector<T> row(512, T(0));
      for (index_t k0 = 0; k0 < 512; k0 += 16) t.bias_row(1, q_pos, k0, 16, row.data() + k0);
      for (index_t j = 0; j < 512; ++j) {
        INFO("bidirectional " << bi << " q " << q_pos << " k " << j);
        REQUIRE(row[static_cast<std::size_t>(j)] == t.bias(1, q_pos, j));
      }
    }
  }
  // bias_row adds; add_bias is the checked form.
  t5_bias<T> t({2}, 4);
  std::vector<T> row(64, T(2)), want(64);
  for (index_t j = 0; j < 64; ++j) want[static_cast<std::size_t>(j)] = T(2) + t.bias(1, 40, j);
  t.add_bias(1, 40, 0, posenc::span<T>(row));
  CHECK(row == want);
}

TEST_CASE("t5_bias: seeded tables are deterministic and bounded", "[t5]") {
  t5_bias<float> a({4}, 7, 0.5), b({4}, 7, 0.5), c({4}, 8, 0.5);
  bool differs = false;
  for (index_t bk = 0; bk < 32; ++bk)
    for (index_t h = 0; h < 4; ++h) {
      CHECK(a.weight(bk, h) == b.weight(bk, h));
      CHECK(std::abs(a.weight(bk, h)) <= 1.0f);  // truncated at 2 stddev
      differs = differs || a.weight(bk, h) != c.weight(bk, h);
    }
  CHECK(differs);
  t5_bias<float> zero({4}, 7, 0.0);
  CHECK(zero.weight(3, 2) == 0.0f);
  CHECK(a.max_positions() == 0);
  CHECK(a.heads() == 4);
  CHECK(a.num_buckets() == 32);
  CHECK(a.max_distance() == 128);
  CHECK(a.bidirectional());
}

TEST_CASE("t5_bias: usage code of docs/encoders/relative.md", "[t5][docs]") {
  // --- docs/encoders/relative.md: t5_bias ---
  // T5-small encoder: 8 heads, 32 buckets, max distance 128, bidirectional.
  // The checkpoint's relative_attention_bias.weight is (num_buckets, heads), row-major.
  std::vector<float> weight(32 * 8, 0.0f);
  weight[5 * 8 + 2] = 1.5f;  // bucket 5, head 2
  posenc::t5_bias_params enc_params;
  enc_params.heads = 8;  // bidirectional, 32 buckets and 128 by default
  posenc::t5_bias<float> encoder(enc_params, Eigen::Map<const posenc::relative_table<float>>(weight.data(), 32, 8));
  // The decoder's table (causal buckets), here seeded instead of loaded.
  posenc::t5_bias_params dec_params = enc_params;
  dec_params.bidirectional = false;
  posenc::t5_bias<float> decoder(dec_params, /*seed=*/42, /*stddev=*/0.05);
  posenc::index_t bk = encoder.bucket(-5);  // key 5 before the query: bucket 5
  float b = encoder.bias(2, 10, 5);         // = weight[bucket(5 - 10), head 2] = 1.5
  std::vector<float> row(16, 0.0f);
  decoder.bias_row(0, 15, 0, 16, row.data());  // query at 15 against keys 0..15
  // --- end ---
  CHECK(bk == 5);
  CHECK(b == 1.5f);
  CHECK(row[15] == decoder.weight(0, 0));
  CHECK(row[0] == decoder.weight(decoder.bucket(-15), 0));
}


TEMPLATE_TEST_CASE("t5_bias: view_of reads the caller's table in place, bit for bit an owned copy of it",
                   "[t5][view]", float, Eigen::half) {
  using T = TestType;
  using posenc::detail::stored_value;
  index_t const nb = 16;
  for (index_t heads : {2, 1}) {  // one head: the caller's layout is then contiguous too
    INFO("heads " << heads);
    t5_bias_params const p{heads, true, nb, 40};
    std::vector<T> buf = random_buffer<T>(nb, heads, 3);
    auto const view = t5_bias<T>::view_of(p, posenc::span<const T>(buf));
    t5_bias<T> const owned(p, as_table(buf, nb, heads));
    CHECK_FALSE(view.owns_table());
    CHECK(owned.owns_table());
    std::size_t bad = 0;
    for (index_t b = 0; b < nb; ++b)
      for (index_t h = 0; h < heads; ++h) {
        bad += view.weight(b, h) != owned.weight(b, h) ? 1 : 0;
        bad += view.weight(b, h) != stored_value<float>(buf[static_cast<std::size_t>(b * heads + h)]) ? 1 : 0;
      }
    CHECK(bad == 0);
    CHECK(view.bias(heads - 1, 30, 2) == owned.bias(heads - 1, 30, 2));
    CHECK(bias_row_mismatches(view, owned, heads) == 0);
    CHECK(view.identity() == owned.identity());

    posenc_test::encoder_run_shape const s{heads, 8};
    auto const fused = posenc_test::attention_output<posenc::path::fused>(view, s);
    auto const reference = posenc_test::attention_output<posenc::path::reference>(view, s);
    CHECK(fused == posenc_test::attention_output<posenc::path::fused>(owned, s));
    CHECK(reference == posenc_test::attention_output<posenc::path::reference>(owned, s));

    // The gradients have the table's shape: an optimiser step on the buffer in place.
    auto const g = posenc_test::attention_encoder_gradients<posenc::path::fused>(view, s);
    CHECK(g.table == posenc_test::attention_encoder_gradients<posenc::path::fused>(owned, s).table);
    CHECK(posenc_test::attention_encoder_gradients<posenc::path::reference>(view, s).table ==
          posenc_test::attention_encoder_gradients<posenc::path::reference>(owned, s).table);
    REQUIRE(g.table.rows() == nb);
    REQUIRE(g.table.cols() == heads);
    auto const id_before = view.identity();
    std::size_t changed = 0;
    for (std::size_t i = 0; i < buf.size(); ++i) {
      T const old = buf[i];
      buf[i] = static_cast<T>(stored_value<float>(buf[i]) - 4.0f * g.table.data()[i]);
      changed += stored_value<float>(buf[i]) != stored_value<float>(old) ? 1 : 0;
    }
    REQUIRE(changed > 0);
    t5_bias<T> const fresh(p, as_table(buf, nb, heads));
    auto const fused_after = posenc_test::attention_output<posenc::path::fused>(view, s);
    CHECK(fused_after == posenc_test::attention_output<posenc::path::fused>(fresh, s));
    CHECK(fused_after != fused);
    CHECK(posenc_test::attention_output<posenc::path::reference>(view, s) ==
          posenc_test::attention_output<posenc::path::reference>(fresh, s));
    CHECK(bias_row_mismatches(view, fresh, heads) == 0);
    CHECK(view.identity() == fresh.identity());
    CHECK(view.identity() != id_before);
    // The owned copy kept the old values.
    CHECK(owned.identity() == id_before);
    CHECK(posenc_test::attention_output<posenc::path::fused>(owned, s) == fused);
  }
}

TEMPLATE_TEST_CASE("t5_bias: copies outlive an owned original; copies of a view read the buffer", "[t5][view]",
                   float, Eigen::half) {
  using T = TestType;
  index_t const heads = 3, nb = 8;
  t5_bias_params const p{heads, false, nb, 20};
  std::vector<T> buf = random_buffer<T>(nb, heads, 4);
  t5_bias<T> const expect(p, as_table(buf, nb, heads));
  {  // Owned: copy-constructed and copy-assigned, then the original goes.
    auto original = std::make_unique<t5_bias<T>>(p, as_table(buf, nb, heads));
    t5_bias<T> copy = *original;
    t5_bias<T> assigned(p, 99);
    assigned = *original;
    original.reset();
    std::vector<T>(buf.size(), T(0)).swap(buf);  // the caller's table changes: owned copies keep theirs
    CHECK(copy.owns_table());
    CHECK(bias_row_mismatches(copy, expect, heads) == 0);
    CHECK(bias_row_mismatches(assigned, expect, heads) == 0);
    CHECK(copy.identity() == expect.identity());
    CHECK(assigned.identity() == expect.identity());
  }
  buf = random_buffer<T>(nb, heads, 4);
  {  // Borrowed: the copies read the same buffer, after the original goes too.
    auto original = std::make_unique<t5_bias<T>>(t5_bias<T>::view_of(p, posenc::span<const T>(buf)));
    t5_bias<T> copy = *original;
    t5_bias<T> assigned(p, 99);
    assigned = *original;
    original.reset();
    CHECK_FALSE(copy.owns_table());
    CHECK_FALSE(assigned.owns_table());
    CHECK(bias_row_mismatches(copy, expect, heads) == 0);
    for (auto& x : buf) x = static_cast<T>(-posenc::detail::stored_value<float>(x) + 0.25f);
    t5_bias<T> const changed(p, as_table(buf, nb, heads));
    CHECK(bias_row_mismatches(copy, changed, heads) == 0);
    CHECK(bias_row_mismatches(assigned, changed, heads) == 0);
    CHECK(bias_row_mismatches(copy, expect, heads) > 0);
    CHECK(copy.identity() == changed.identity());
  }
}
}  // namespace encoding_t5_bias_tests
