// SPDX-License-Identifier: MIT
// What posenc::compiled holds: the combinations of types and encoders whose fused kernels it
// compiles once, as X-macro lists read by the declarations (compiled/forward.hpp, backward.hpp, paged.hpp) and by the
// library's sources (src/compiled/).
#pragma once

#include <Eigen/Core>

#include "posenc/encoding/alibi.hpp"
#include "posenc/encoding/clipped_bias.hpp"
#include "posenc/encoding/compose.hpp"
#include "posenc/encoding/none.hpp"
#include "posenc/encoding/rope.hpp"
#include "posenc/encoding/shaw.hpp"
#include "posenc/encoding/t5_bias.hpp"

namespace posenc::compiled {

/// compose of RoPE and ALiBi, the one composition the library holds (a name without a comma,
/// for the lists below).
using rope_alibi = compose<rope<float>, alibi<float>>;

}  // namespace posenc::compiled

/// X(E) for every encoder the library holds a kernel of (float compute type). The absolute
/// encoders (sinusoidal, learned) add to the embeddings and reach the kernel as `none`.
#define POSENC_COMPILED_ENCODERS(X, ...)           \
  X(__VA_ARGS__, ::posenc::none)                    \
  X(__VA_ARGS__, ::posenc::rope<float>)             \
  X(__VA_ARGS__, ::posenc::alibi<float>)            \
  X(__VA_ARGS__, ::posenc::t5_bias<float>)          \
  X(__VA_ARGS__, ::posenc::clipped_bias<float>)     \
  X(__VA_ARGS__, ::posenc::shaw<float>)             \
  X(__VA_ARGS__, ::posenc::compiled::rope_alibi)

/// X(Q, KV, O, E) for every forward (contiguous) kernel: q, k and v, out as stored, computed
/// in float. Float tensors; a 16-bit cache or K/V with float q and out; all four 16-bit, and
/// all 16-bit but q, which is how an all-16-bit call whose q is rotated or shifted reaches the
/// kernel (q as a float copy, never rounded). One list per storage (one source file of the
/// library each). Every kernel an entry of the library calls must be in these lists, or the
/// entry would compile it for the entries' own instruction set (tests/compiled checks that
/// none does).
#define POSENC_COMPILED_FORWARD_FLOAT(X) POSENC_COMPILED_ENCODERS(X, float, float, float)
#define POSENC_COMPILED_FORWARD_HALF_KV(X) POSENC_COMPILED_ENCODERS(X, float, Eigen::half, float)
#define POSENC_COMPILED_FORWARD_HALF(X)                                 \
  POSENC_COMPILED_ENCODERS(X, Eigen::half, Eigen::half, Eigen::half)     \
  POSENC_COMPILED_ENCODERS(X, float, Eigen::half, Eigen::half)
#define POSENC_COMPILED_FORWARD_BF16_KV(X) POSENC_COMPILED_ENCODERS(X, float, Eigen::bfloat16, float)
#define POSENC_COMPILED_FORWARD_BF16(X)                                            \
  POSENC_COMPILED_ENCODERS(X, Eigen::bfloat16, Eigen::bfloat16, Eigen::bfloat16)    \
  POSENC_COMPILED_ENCODERS(X, float, Eigen::bfloat16, Eigen::bfloat16)
#define POSENC_COMPILED_FORWARD(X)  \
  POSENC_COMPILED_FORWARD_FLOAT(X)   \
  POSENC_COMPILED_FORWARD_HALF_KV(X) \
  POSENC_COMPILED_FORWARD_HALF(X)    \
  POSENC_COMPILED_FORWARD_BF16_KV(X) \
  POSENC_COMPILED_FORWARD_BF16(X)

/// X(S, Q, O, E) for every paged kernel: pages stored as S, q and out as given (a rotated q
/// arrives as a float copy), computed in float. One list per page storage.
#define POSENC_COMPILED_PAGED_FLOAT(X) POSENC_COMPILED_ENCODERS(X, float, float, float)
#define POSENC_COMPILED_PAGED_HALF(X)                             \
  POSENC_COMPILED_ENCODERS(X, Eigen::half, float, float)           \
  POSENC_COMPILED_ENCODERS(X, Eigen::half, Eigen::half, Eigen::half) \
  POSENC_COMPILED_ENCODERS(X, Eigen::half, float, Eigen::half)
#define POSENC_COMPILED_PAGED_BF16(X)                                          \
  POSENC_COMPILED_ENCODERS(X, Eigen::bfloat16, float, float)                    \
  POSENC_COMPILED_ENCODERS(X, Eigen::bfloat16, Eigen::bfloat16, Eigen::bfloat16) \
  POSENC_COMPILED_ENCODERS(X, Eigen::bfloat16, float, Eigen::bfloat16)
#define POSENC_COMPILED_PAGED(X) \
  POSENC_COMPILED_PAGED_FLOAT(X)  \
  POSENC_COMPILED_PAGED_HALF(X)   \
  POSENC_COMPILED_PAGED_BF16(X)

/// X(S, Q, E) for every paged call the library holds whole (its entry: q and out of type Q,
/// float or the page type S).
#define POSENC_COMPILED_PAGED_CALLS(X)                          \
  POSENC_COMPILED_ENCODERS(X, float, float)                      \
  POSENC_COMPILED_ENCODERS(X, Eigen::half, float)                \
  POSENC_COMPILED_ENCODERS(X, Eigen::half, Eigen::half)          \
  POSENC_COMPILED_ENCODERS(X, Eigen::bfloat16, float)            \
  POSENC_COMPILED_ENCODERS(X, Eigen::bfloat16, Eigen::bfloat16)

/// X(T, E) for every backward kernel (float tensors).
#define POSENC_COMPILED_BACKWARD(X) POSENC_COMPILED_ENCODERS(X, float)
