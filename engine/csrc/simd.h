// AVX2 helpers shared by the engine's CPU kernels (cpu_kernels.cpp, decode_step.cpp, q4_kernels.cpp);
// engine/cpu_kernels.py hashes this file with the sources into the extension's build name, so a
// change here rebuilds the kernels.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// VNNI (AVX512-VNNI with AVX512VL, or AVX-VNNI): vpdpbusd adds to each int32 lane the 4 products of that
// lane's unsigned bytes of u and signed bytes of s, without saturation. Its lanes equal
// madd_epi16(maddubs_epi16(u, s), 1) exactly wherever maddubs' int16 pair sums do not saturate (|u|, |s| <= 128
// and one side <= 127: the int8 kernels' operands), so the two paths give the same integers.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define INFERCTL_VNNI 1
#define INFERCTL_DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__)
#define INFERCTL_VNNI 1
#define INFERCTL_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#else
#define INFERCTL_VNNI 0
#endif

namespace inferctl_simd {

// int32 lanes of the products of unsigned bytes u and signed bytes s, 4 adjacent pairs a lane (see above).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if INFERCTL_VNNI
  return INFERCTL_DPBUSD(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

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
