// SPDX-License-Identifier: MIT
// The posenc tour: what the library is, on this machine.
#include <posenc/posenc.hpp>

#include <cstdio>

int main() {
  std::printf("posenc %s\n", posenc::version_string());
  std::printf("  SIMD instruction set : %s (%d float lanes)\n", posenc::simd::arch_name(),
              static_cast<int>(posenc::simd::width<float>));
  std::printf("  threads              : %d (%s)\n", posenc::default_threads(),
              posenc::has_openmp() ? "OpenMP" : "serial build");
  std::printf("\nEncoders plug into attention through encoder_traits<E>:\n");
  std::printf("  adds_to_embeddings   sinusoidal, learned\n");
  std::printf("  rotates_queries_keys RoPE (none, linear, dynamic NTK, YaRN, Llama 3, LongRoPE)\n");
  std::printf("  biases_scores        ALiBi, T5 buckets, clipped relative bias\n");
  std::printf("  relative_key_value   Shaw relative keys/values\n");
  return 0;
}
