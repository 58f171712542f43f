// SPDX-License-Identifier: MIT
// posenc::compiled with dispatch (x86-64): the kernels are built once per level (sse2, avx2,
// avx512, and the forward kernels again as avx512_bf16 for the bfloat16 product mode), each
// in a namespace of its own with every other symbol of its build renamed
// (cmake/posenc_isolate.sh), and this file calls the level chosen once at run time.
// Built without -march: it runs on any x86-64 CPU. POSENC_COMPILED_HAS_<LEVEL> (from CMake's
// POSENC_COMPILED_LEVELS, default every level) says which levels the library holds; sse2 always.
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "posenc/compiled.hpp"
#include "posenc/core/error.hpp"
#include "declare.hpp"

#ifndef POSENC_COMPILED_HAS_AVX2
#define POSENC_COMPILED_HAS_AVX2 1
#endif
#ifndef POSENC_COMPILED_HAS_AVX512
#define POSENC_COMPILED_HAS_AVX512 1
#endif
#ifndef POSENC_COMPILED_HAS_AVX512_BF16
#define POSENC_COMPILED_HAS_AVX512_BF16 1
#endif
#if POSENC_COMPILED_HAS_AVX512_BF16 && !POSENC_COMPILED_HAS_AVX512
#error "posenc::compiled: the avx512_bf16 level hands its other calls to the avx512 level, which is missing"
#endif
// A switch case of a level the library holds (none for a level it does not).
#if POSENC_COMPILED_HAS_AVX2
#define POSENC_IF_AVX2(...) __VA_ARGS__
#else
#define POSENC_IF_AVX2(...)
#endif
#if POSENC_COMPILED_HAS_AVX512
#define POSENC_IF_AVX512(...) __VA_ARGS__
#else
#define POSENC_IF_AVX512(...)
#endif
#if POSENC_COMPILED_HAS_AVX512_BF16
#define POSENC_IF_AVX512_BF16(...) __VA_ARGS__
#else
#define POSENC_IF_AVX512_BF16(...)
#endif

namespace posenc::detail::compiled_kernels {

POSENC_COMPILED_DECLARE_LEVEL(sse2)
POSENC_IF_AVX2(POSENC_COMPILED_DECLARE_LEVEL(avx2))
POSENC_IF_AVX512(POSENC_COMPILED_DECLARE_LEVEL(avx512))
#if POSENC_COMPILED_HAS_AVX512_BF16
namespace avx512_bf16 {  // the forward kernels' bfloat16 product mode only
POSENC_COMPILED_FORWARD(POSENC_COMPILED_DECLARE_FORWARD)
}  // namespace avx512_bf16
#endif

namespace {

enum level : int { sse2_v, avx2_v, avx512_v, avx512_bf16_v, unset_v = -1 };
char const* const level_names[] = {"sse2", "avx2", "avx512", "avx512_bf16"};
constexpr bool level_held[] = {true, POSENC_COMPILED_HAS_AVX2 != 0, POSENC_COMPILED_HAS_AVX512 != 0,
                               POSENC_COMPILED_HAS_AVX512_BF16 != 0};

/// The highest level the library holds at or below `l`.
level held_level(int l) noexcept {
  while (l > sse2_v && !level_held[l]) --l;
  return static_cast<level>(l);
}

/// The best level this CPU runs and the library holds.
level cpu_level() noexcept {
  __builtin_cpu_init();
  bool const avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  bool const avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512cd");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return held_level(avx512_bf16_v);
  if (avx512) return held_level(avx512_v);
  if (avx2) return held_level(avx2_v);
  return sse2_v;
}

/// The levels the library holds, as "sse2, avx512".
std::string held_names() {
  std::string out;
  for (int l = sse2_v; l <= avx512_bf16_v; ++l)
    if (level_held[l]) out += (out.empty() ? "" : ", ") + std::string(level_names[l]);
  return out;
}

/// The level named `name` ("best": `best`), checked against `best`, the CPU's best level.
level parse_level(std::string const& name, level best, char const* where, char const* what) {
  if (name == "best") return best;
  for (int l = sse2_v; l <= avx512_bf16_v; ++l) {
    if (name != level_names[l]) continue;
    require(level_held[l], where, what, " is ", name, ", expected a level the library holds (", held_names(),
            ": POSENC_COMPILED_LEVELS)");
    require(l <= best, where, what, " is ", name, ", expected a level this CPU runs (its best is ",
            level_names[best], ")");
    return static_cast<level>(l);
  }
  require(false, where, what, " is ", name, ", expected sse2, avx2, avx512, avx512_bf16 or best");
  return sse2_v;
}

std::atomic<int> active{unset_v};

level active_level() {
  int l = active.load(std::memory_order_acquire);
  if (l == unset_v) {
    char const* env = std::getenv("POSENC_ISA");
    l = env && *env ? parse_level(env, cpu_level(), "posenc::compiled", "POSENC_ISA") : cpu_level();
    active.store(l, std::memory_order_release);
  }
  return static_cast<level>(l);
}

/// The level of a call: the bfloat16 product mode's own build on avx512_bf16, the rest on avx512.
level kernel_level(level l, bool bf16_products = false) noexcept {
  return l == avx512_bf16_v && !bf16_products ? avx512_v : l;
}

}  // namespace

/// The level `name` resolves to on a CPU whose best level is `cpu_best` (tests/compiled).
std::string resolve_level(std::string const& name, std::string const& cpu_best) {
  return level_names[parse_level(name, parse_level(cpu_best, avx512_bf16_v, "", ""), "posenc::compiled",
                                 "POSENC_ISA")];
}

#define POSENC_COMPILED_DISPATCH_FORWARD(Q, KV, O, E)                                                   \
  void forward(attention_plan<float> const& p, view<const Q> q, view<const KV> k, view<const KV> v,     \
               view<O> out, E const& enc, rotation_ids const* rot) {                                    \
    switch (kernel_level(active_level(), p.products == product_precision::bfloat16)) {                 \
      POSENC_IF_AVX512_BF16(case avx512_bf16_v: return avx512_bf16::forward(p, q, k, v, out, enc, rot);)                       \
      POSENC_IF_AVX512(case avx512_v: return avx512::forward(p, q, k, v, out, enc, rot);)                                 \
      POSENC_IF_AVX2(case avx2_v: return avx2::forward(p, q, k, v, out, enc, rot);)                                     \
      default: return sse2::forward(p, q, k, v, out, enc, rot);                                         \
    }                                                                                                   \
  }
#define POSENC_COMPILED_DISPATCH_PAGED(S, Q, O, E)                                                       \
  void paged(bool lanes, fused::paged_work<float, S>& w, index_t entries, view<const Q> q, view<O> out,  \
             E const& enc, rotation_ids const* rots, fused::paged_strides const& ps, int threads) {        \
    switch (kernel_level(active_level())) {                                                              \
      POSENC_IF_AVX512(case avx512_v: return avx512::paged(lanes, w, entries, q, out, enc, rots, ps, threads);)            \
      POSENC_IF_AVX2(case avx2_v: return avx2::paged(lanes, w, entries, q, out, enc, rots, ps, threads);)                \
      default: return sse2::paged(lanes, w, entries, q, out, enc, rots, ps, threads);                    \
    }                                                                                                    \
  }
#define POSENC_COMPILED_DISPATCH_BACKWARD(T, E)                                                        \
  void backward(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,                 \
                encoder_gradients_t<E>& grads) {                                                       \
    switch (kernel_level(active_level())) {                                                            \
      POSENC_IF_AVX512(case avx512_v: return avx512::backward(p, io, enc, grads);)                                       \
      POSENC_IF_AVX2(case avx2_v: return avx2::backward(p, io, enc, grads);)                                           \
      default: return sse2::backward(p, io, enc, grads);                                               \
    }                                                                                                  \
  }

POSENC_COMPILED_FORWARD(POSENC_COMPILED_DISPATCH_FORWARD)
POSENC_COMPILED_PAGED(POSENC_COMPILED_DISPATCH_PAGED)
POSENC_COMPILED_BACKWARD(POSENC_COMPILED_DISPATCH_BACKWARD)

// The entries a consumer's call reaches (declared in compiled/forward.hpp, backward.hpp and
// attention/paged_attention.hpp): the active level's build of the whole call (the avx512_bf16
// level's calls run on avx512's entries, whose kernel calls come back here with the products
// mode).
#define POSENC_COMPILED_LEVEL_CALL(f, ...)                     \
  switch (kernel_level(active_level())) {                      \
    POSENC_IF_AVX512(case avx512_v: return avx512::f(__VA_ARGS__);)              \
    POSENC_IF_AVX2(case avx2_v: return avx2::f(__VA_ARGS__);)                  \
    default: return sse2::f(__VA_ARGS__);                      \
  }
#define POSENC_COMPILED_DISPATCH_ENTRY(Q, KV, O, E)                                                     \
  void attention_call(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc,   \
                      attention_options<float> const& opt, half_masks const& masks16) {                 \
    POSENC_COMPILED_LEVEL_CALL(attention_call, q, k, v, out, enc, opt, masks16)                         \
  }
#define POSENC_COMPILED_DISPATCH_BACKWARD_ENTRY(T, E)                                                   \
  void attention_backward_call(view<const T> q, view<const T> k, view<const T> v, view<const T> out,   \
                               view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,   \
                               attention_options<T> const& opt, encoder_gradients_t<E>& grads,        \
                               half_masks const& masks16) {                                           \
    POSENC_COMPILED_LEVEL_CALL(attention_backward_call, q, k, v, out, dout, dq, dk, dv, enc, opt, grads, masks16) \
  }
#define POSENC_COMPILED_DISPATCH_PAGED_ENTRY(S, Q, E)                                                   \
  void paged_attention_call(view<const Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, \
                            view<Q> out, E const& enc, attention_options<float> const& opt,             \
                            half_masks const& masks16, fused::paged_work<float, S>& work) {             \
    POSENC_COMPILED_LEVEL_CALL(paged_attention_call, q, cache, seq_ids, out, enc, opt, masks16, work)     \
  }
namespace entry {
POSENC_COMPILED_FORWARD(POSENC_COMPILED_DISPATCH_ENTRY)
POSENC_COMPILED_BACKWARD(POSENC_COMPILED_DISPATCH_BACKWARD_ENTRY)
POSENC_COMPILED_PAGED_CALLS(POSENC_COMPILED_DISPATCH_PAGED_ENTRY)
}  // namespace entry

index_t lane_min_rows() {
  switch (kernel_level(active_level())) {
    POSENC_IF_AVX512(case avx512_v: return avx512::lane_min_rows();)
    POSENC_IF_AVX2(case avx2_v: return avx2::lane_min_rows();)
    default: return sse2::lane_min_rows();
  }
}

}  // namespace posenc::detail::compiled_kernels

namespace posenc::compiled {

using namespace detail::compiled_kernels;

std::string isa() { return level_names[active_level()]; }

std::string arch() {
  switch (kernel_level(active_level())) {
    POSENC_IF_AVX512(case avx512_v: return avx512::arch();)
    POSENC_IF_AVX2(case avx2_v: return avx2::arch();)
    default: return sse2::arch();
  }
}

std::vector<std::string> isas() {
  std::vector<std::string> out;
  for (int l = sse2_v; l <= cpu_level(); ++l) out.emplace_back(level_names[l]);
  return out;
}

void set_isa(std::string const& name) {
  active.store(parse_level(name, cpu_level(), "posenc::compiled::set_isa", "level"), std::memory_order_release);
}

}  // namespace posenc::compiled
