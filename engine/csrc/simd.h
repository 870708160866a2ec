// AVX2 helpers shared by the engine's CPU kernels (cpu_kernels.cpp, decode_step.cpp, q4_kernels.cpp);
// engine/cpu_kernels.py hashes this file with the sources into the extension's build name, so a
// change here rebuilds the kernels.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace inferctl_simd {

// The sum of the 8 fp32 lanes of v (two halves added, then pairs, then the last two).
inline float hsum8(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  return _mm_cvtss_f32(_mm_add_ss(s, sh));
}

}  // namespace inferctl_simd
#endif
