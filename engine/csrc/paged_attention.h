// Inline helpers of paged attention over a block-paged KV pool (csrc/paged_attention.cpp; shareable
// with csrc/decode_step.cpp). Pool layout of one layer (engine.attention.KVCache, head-major):
// [kv_heads, num_blocks, block_size, head_dim] float32, so key t of a sequence whose block table is
// `table` lives at ((kh * num_blocks + table[t / bs]) * bs + t % bs) * D.
//
// attend_tile computes, for the query rows of a tile (up to PA_TILE_TOKENS consecutive tokens of one
// sequence x the g query heads that share one kv head, GQA), softmax(q.K^T * scale) V over each row's causal
// keys, read IN PLACE through the block table one block at a time (each block read once for all the tile's
// rows), with the online-softmax recurrence of FlashAttention (Dao et al. 2022, "FlashAttention: Fast and
// Memory-Efficient Exact Attention with IO-Awareness", Alg. 1; the running max/normaliser of Milakov &
// Gimelshein 2018, "Online normalizer calculation for softmax"): per block j with scores s_j,
//   m' = max(m, max s_j);  l' = l * exp(m - m') + sum exp(s_j - m');  o' = o * exp(m - m') + exp(s_j - m') V_j
// and o / l at the end. fp32 throughout. No allocation, no threads: the caller parallelises.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define INFERCTL_PA_AVX2 1
#else
#define INFERCTL_PA_AVX2 0
#endif

namespace inferctl_attn {

constexpr int64_t MAX_HEAD_DIM = 512;   // acc/q rows live on the stack of the caller's chunk
constexpr int64_t MAX_BLOCK_SIZE = 256; // one block's scores per head on the stack
constexpr int64_t MAX_GROUP = 64;       // query heads per kv head

// sum_i a[i] * b[i] (8-lane FMA partial sums with AVX2, then a horizontal add)
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.f;
#if INFERCTL_PA_AVX2
  if (n >= 8) {
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    s = inferctl_simd::hsum8(acc);
  }
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if INFERCTL_PA_AVX2
// exp of 8 lanes: Cephes' expf (range reduction x = n ln2 + r with ln2 split in two constants, a degree-5
// polynomial for e^r, 2^n through the exponent bits), as in Pommier's avx_mathfun; relative error ~2 ulp
// over the clamped range [-88.38, 88.38] (below it the result is 0, as expf's underflow).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

// s[i] = exp(s[i] - m) for i < n; returns their sum (8 lanes with AVX2, then the scalar tail)
inline float exp_sub_sum(float* s, int64_t n, float m) {
  int64_t i = 0;
  float sum = 0.f;
#if INFERCTL_PA_AVX2
  if (n >= 8) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
      _mm256_storeu_ps(s + i, e);
      acc = _mm256_add_ps(acc, e);
    }
    sum = inferctl_simd::hsum8(acc);
  }
#endif
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  return sum;
}

// y[i] = y[i] * c + a * x[i]
inline void scale_axpy(float c, float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if INFERCTL_PA_AVX2
  const __m256 cv = _mm256_set1_ps(c), av = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_mul_ps(cv, _mm256_loadu_ps(y + i))));
#endif
  for (; i < n; ++i) y[i] = y[i] * c + a * x[i];
}

// y[i] += a * x[i]
inline void axpy(float a, const float* x, float* y, int64_t n) { scale_axpy(1.f, a, x, y, n); }

// s[i] = (q . k_i) * scale for the cnt keys k_i = kb + i * D of one block. With AVX2 and D % 8 == 0, four
// keys at a time share each q load and their four 8-lane partial sums are reduced together (two hadd
// levels, then the two 128-bit halves added); other keys and shapes go through dot().
inline void block_scores(const float* q, const float* kb, int64_t cnt, int64_t D, float scale, float* s) {
  int64_t i = 0;
#if INFERCTL_PA_AVX2
  if (D % 8 == 0) {
    const __m128 sv = _mm_set1_ps(scale);
    for (; i + 4 <= cnt; i += 4) {
      const float* k0 = kb + i * D;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + D + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * D + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * D + d), a3);
      }
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
      const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_storeu_ps(s + i, _mm_mul_ps(r, sv));
    }
  }
#endif
  for (; i < cnt; ++i) s[i] = dot(q, kb + i * D, D) * scale;
}

// a[d] = a[d] * c + sum_i p[i] * vb[i * D + d] over the cnt rows of one block: 8 output lanes stay in a
// register across the rows (one load and one store of a per 8 lanes, not per row).
inline void rescale_accumulate(float c, const float* p, const float* vb, int64_t cnt, int64_t D, float* a) {
  int64_t d = 0;
#if INFERCTL_PA_AVX2
  const __m256 cv = _mm256_set1_ps(c);
  for (; d + 8 <= D; d += 8) {
    __m256 o = _mm256_mul_ps(cv, _mm256_loadu_ps(a + d));
    for (int64_t i = 0; i < cnt; ++i) o = _mm256_fmadd_ps(_mm256_set1_ps(p[i]), _mm256_loadu_ps(vb + i * D + d), o);
    _mm256_storeu_ps(a + d, o);
  }
#endif
  for (; d < D; ++d) {
    float o = a[d] * c;
    for (int64_t i = 0; i < cnt; ++i) o += p[i] * vb[i * D + d];
    a[d] = o;
  }
}

// Two query rows against the cnt keys of one block (s0, s1): with AVX2 and D % 8 == 0, four keys at a time
// share each K load between the rows (8 accumulators, the same hadd reduction per row as block_scores);
// otherwise block_scores per row.
inline void block_scores2(const float* q0, const float* q1, const float* kb, int64_t cnt, int64_t D, float scale,
                          float* s0, float* s1) {
  int64_t i = 0;
#if INFERCTL_PA_AVX2
  if (D % 8 == 0) {
    const __m128 sv = _mm_set1_ps(scale);
    for (; i + 4 <= cnt; i += 4) {
      const float* k0 = kb + i * D;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 x = _mm256_loadu_ps(q0 + d), y = _mm256_loadu_ps(q1 + d);
        __m256 k = _mm256_loadu_ps(k0 + d);
        a0 = _mm256_fmadd_ps(x, k, a0);
        b0 = _mm256_fmadd_ps(y, k, b0);
        k = _mm256_loadu_ps(k0 + D + d);
        a1 = _mm256_fmadd_ps(x, k, a1);
        b1 = _mm256_fmadd_ps(y, k, b1);
        k = _mm256_loadu_ps(k0 + 2 * D + d);
        a2 = _mm256_fmadd_ps(x, k, a2);
        b2 = _mm256_fmadd_ps(y, k, b2);
        k = _mm256_loadu_ps(k0 + 3 * D + d);
        a3 = _mm256_fmadd_ps(x, k, a3);
        b3 = _mm256_fmadd_ps(y, k, b3);
      }
      const __m256 ha = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
      const __m256 hb = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
      _mm_storeu_ps(s0 + i, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(ha), _mm256_extractf128_ps(ha, 1)), sv));
      _mm_storeu_ps(s1 + i, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(hb), _mm256_extractf128_ps(hb, 1)), sv));
    }
  }
#endif
  block_scores(q0, kb + i * D, cnt - i, D, scale, s0 + i);
  block_scores(q1, kb + i * D, cnt - i, D, scale, s1 + i);
}

// rescale_accumulate for two rows over the same block: each V load feeds both rows' 8 output lanes.
inline void rescale_accumulate2(float c0, const float* p0, float* a0, float c1, const float* p1, float* a1,
                                const float* vb, int64_t cnt, int64_t D) {
  int64_t d = 0;
#if INFERCTL_PA_AVX2
  const __m256 cv0 = _mm256_set1_ps(c0), cv1 = _mm256_set1_ps(c1);
  for (; d + 8 <= D; d += 8) {
    __m256 o0 = _mm256_mul_ps(cv0, _mm256_loadu_ps(a0 + d)), o1 = _mm256_mul_ps(cv1, _mm256_loadu_ps(a1 + d));
    for (int64_t i = 0; i < cnt; ++i) {
      const __m256 v = _mm256_loadu_ps(vb + i * D + d);
      o0 = _mm256_fmadd_ps(_mm256_set1_ps(p0[i]), v, o0);
      o1 = _mm256_fmadd_ps(_mm256_set1_ps(p1[i]), v, o1);
    }
    _mm256_storeu_ps(a0 + d, o0);
    _mm256_storeu_ps(a1 + d, o1);
  }
#endif
  for (; d < D; ++d) {   // every column without AVX2, else the last D % 8
    float o0 = a0[d] * c0, o1 = a1[d] * c1;
    for (int64_t i = 0; i < cnt; ++i) {
      o0 += p0[i] * vb[i * D + d];
      o1 += p1[i] * vb[i * D + d];
    }
    a0[d] = o0;
    a1[d] = o1;
  }
}

// max of s[0..n), n >= 1 (8 lanes with AVX2, then the lanes and the scalar tail; exact, order-free)
inline float max_of(const float* s, int64_t n) {
  int64_t i = 0;
  float mb = s[0];
#if INFERCTL_PA_AVX2
  if (n >= 8) {
    __m256 v = _mm256_loadu_ps(s);
    for (i = 8; i + 8 <= n; i += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(s + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    mb = _mm_cvtss_f32(h);
  }
#endif
  for (; i < n; ++i) mb = std::max(mb, s[i]);
  return mb;
}

// One online-softmax update of row state (m, l, acc row a) with the cnt exponentiated-in-place scores s.
inline float softmax_update(float* s, int64_t cnt, float& m, float& l) {
  const float mb = max_of(s, cnt);
  const float m_new = std::max(m, mb);
  const float corr = std::exp(m - m_new);   // exp(-inf) = 0 on the first block
  l = l * corr + exp_sub_sum(s, cnt, m_new);
  m = m_new;
  return corr;
}

constexpr int64_t MAX_TILE_ROWS = 64;   // query rows (tokens x GQA heads) of one attend_tile call

// attend_tile: the attention of nq consecutive query tokens of ONE sequence (a tile of a prefill chunk, or a
// decode token with nq = 1) at positions pos0 .. pos0 + nq - 1 over the kv head k_head/v_head (its
// [num_blocks, bs, D] pool; table lists the sequence's blocks), sharing each K/V block read between all
// nq * g rows (token-major: row r is token r / g, query head r % g). Token i attends keys 0 .. pos0 + i, so in
// the tile's last blocks a row takes only its own keys (a count per row: exact causal masking, no -inf
// padding). Rows are taken in pairs where both see the same keys (block_scores2 / rescale_accumulate2: one K/V
// load for two rows), else one at a time; either way a row's numbers are the same, bit for bit, as when it
// is computed alone (same operations in the same order per row). q: token 0's first head, token stride
// q_tok, heads D apart; out likewise with out_tok. acc: scratch of nq * g * D floats; nq * g <= MAX_TILE_ROWS.
inline void attend_tile(const float* q, int64_t q_tok, int64_t nq, int64_t g, const float* k_head,
                        const float* v_head, const int64_t* table, int64_t pos0, int64_t bs, int64_t D, float scale,
                        float* out, int64_t out_tok, float* acc) {
  const int64_t R = nq * g;
  float m[MAX_TILE_ROWS], l[MAX_TILE_ROWS], s[2][MAX_BLOCK_SIZE];
  const float* qr[MAX_TILE_ROWS];
  int64_t n[MAX_TILE_ROWS];
  for (int64_t r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
    qr[r] = q + (r / g) * q_tok + (r % g) * D;
    n[r] = pos0 + r / g + 1;
  }
  std::fill(acc, acc + R * D, 0.f);
  const int64_t nblocks = (n[R - 1] + bs - 1) / bs;
  for (int64_t j = 0; j < nblocks; ++j) {
    const int64_t base = table[j] * bs * D;
    const float* kb = k_head + base;
    const float* vb = v_head + base;
    const int64_t k0 = j * bs;
    int64_t r = 0;
    while (r < R && n[r] <= k0) ++r;   // rows whose keys all lie in earlier blocks
    while (r < R) {
      const int64_t cnt = std::min(bs, n[r] - k0);
      if (r + 1 < R && std::min(bs, n[r + 1] - k0) == cnt) {
        block_scores2(qr[r], qr[r + 1], kb, cnt, D, scale, s[0], s[1]);
        const float c0 = softmax_update(s[0], cnt, m[r], l[r]);
        const float c1 = softmax_update(s[1], cnt, m[r + 1], l[r + 1]);
        rescale_accumulate2(c0, s[0], acc + r * D, c1, s[1], acc + (r + 1) * D, vb, cnt, D);
        r += 2;
      } else {
        block_scores(qr[r], kb, cnt, D, scale, s[0]);
        const float c0 = softmax_update(s[0], cnt, m[r], l[r]);
        rescale_accumulate(c0, s[0], vb, cnt, D, acc + r * D);
        r += 1;
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const float inv = 1.f / l[r];
    const float* a = acc + r * D;
    float* o = out + (r / g) * out_tok + (r % g) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = a[d] * inv;
  }
}

}  // namespace inferctl_attn
