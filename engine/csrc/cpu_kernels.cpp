// CPU kernels for small-batch decode (inferctl.engine.cpu_kernels loads this at first use).
//
// gemv_f32   y[B, N] = x[B, K] @ W[N, K]^T          (W in nn.Linear's [out, in] layout)
// gemv_int8  y[B, N] = (x[B, K] @ Q[N, :K]^T) * s[N] (Q int8 [out, in_padded], s fp32 per output row)
//            x quantized to int8 per block of 32 (llama.cpp Q8_0) where AVX2 is there
// rms_norm   y[T, D] = x * 1/sqrt(mean(x^2) + eps) * w   (Zhang & Sennrich 2019)
// silu_mul   y[T, H] = silu(gu[:, :H]) * gu[:, H:]     (SwiGLU, Shazeer 2020)
//
// Each output row of a GEMV is a dot product over one contiguous row of W, so the weight is read
// once by each thread (the layout llama.cpp's ggml_vec_dot_f32 streams), as 4 side-by-side streams
// (gemv_rows). Up to MAX_B activation rows share each weight row (fp32: in pairs while the row sits in L1;
// int8: 1-3 rows 4 weight rows x G activation rows per inner step, q8_seg; 4 or more rows 8 weight rows
// repacked 8 rows x 4 bytes, each broadcast activation dword feeding the 8, q8_il; one vpdpbusd per 32
// products where the CPU has VNNI, simd.h). Python sends
// fp32 where cpu_kernels.f32_kernel_wins (up to 8 rows at 1 thread, 16 at more: MKL's GEMM wins above
// that) and int8 up to MAX_BATCH_INT8 (64: torch's int8 kernel takes bf16 activations, emulated
// without bf16 hardware); the fused decode op (decode_step.cpp) calls both with up to 64 rows.
// Threads: at::parallel_for over output rows on torch's own OpenMP pool (engine.cpu_kernels builds with
// -fopenmp, so the calls run on torch.set_num_threads threads; built without it, at::parallel_for ran
// every chunk on the calling thread). AVX2+FMA intrinsics when the compiler targets them
// (-march=native on such a CPU), a scalar loop otherwise. int8 weights are widened to fp32 in
// registers (no bf16 anywhere). Inputs are checked by the Python wrapper; the C++ checks again
// with TORCH_CHECK (a RuntimeError, never a crash).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define INFERCTL_AVX2 1
#else
#define INFERCTL_AVX2 0
#endif

namespace {

constexpr int64_t MAX_B = 64;  // cpu_kernels.MAX_BATCH_INT8
constexpr int64_t L2_PANEL_BYTES = 192 * 1024;  // int8 weight panel of gemv_int8 (L2: 512 KiB per core)
constexpr int64_t GRAIN_ELEMS = 1 << 16;  // weights per parallel chunk: smaller work stays on one thread

#if INFERCTL_AVX2
using inferctl_simd::hsum8;
using inferctl_simd::dot_u8s8;

inline __m256 load_i8x8(const int8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
#endif

#if INFERCTL_AVX2
// out[i] = hsum8(v[i]) for the 8 vectors v[0..8), bit for bit (the same adds in the same pairs: lane j plus lane
// j + 4, then lanes (0,1) and (2,3) of that, then the two sums), as one transposed reduction: 4 cross-half
// permutes + 4 adds put two vectors' half sums in one vector, then 3 hadds, 1 store; hsum8 costs ~6 shuffles and
// adds per vector. At small K the per-output reductions are much of gemv_f32's work: on stories260K's five linears
// (K = 64 / 172) this cut 1 thread's CPU time 1.5-2.6x at 8-32 rows (wave 10, same-run A/B, docs/performance.md).
inline void hsum8x8(const __m256* v, float* out) {
  __m256 h[4];
  for (int i = 0; i < 4; ++i)   // h[i] = [v[i] lanes j + (j + 4), v[i + 4] lanes j + (j + 4)], j = 0..3
    h[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[i], v[i + 4], 0x20), _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
  // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | the same of the high halves]: the high halves hold v[4..8)
  _mm256_storeu_ps(out, _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3])));
}
#endif

// S output rows (wr[0..S), one from each of the S segments of a thread's chunk, see gemv_rows) for G
// activation rows: out[s * G + g] = sum_k x[g, k] * wr[s][k]. One 8-lane accumulator per (row, activation
// row); each weight vector is loaded once and used G times, each activation vector once per row.
template <int S, int G, typename W>
inline void seg_dot(const float* x, int64_t ldx, const W* const* wr, int64_t K, float* out) {
  int64_t k = 0;
#if INFERCTL_AVX2
  __m256 acc[S][G];
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < G; ++g) acc[s][g] = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    __m256 xv[G];
    for (int g = 0; g < G; ++g) xv[g] = _mm256_loadu_ps(x + g * ldx + k);
    for (int s = 0; s < S; ++s) {
      __m256 wv;
      if constexpr (std::is_same_v<W, float>) {
        wv = _mm256_loadu_ps(wr[s] + k);
      } else {
        wv = load_i8x8(wr[s] + k);
      }
      for (int g = 0; g < G; ++g) acc[s][g] = _mm256_fmadd_ps(xv[g], wv, acc[s][g]);
    }
  }
  if constexpr (S * G == 8) {
    hsum8x8(&acc[0][0], out);
  } else {
    for (int s = 0; s < S; ++s)
      for (int g = 0; g < G; ++g) out[s * G + g] = hsum8(acc[s][g]);
  }
#else
  for (int i = 0; i < S * G; ++i) out[i] = 0.f;
#endif
  for (; k < K; ++k)
    for (int s = 0; s < S; ++s) {
      const float wk = static_cast<float>(wr[s][k]);
      for (int g = 0; g < G; ++g) out[s * G + g] += x[g * ldx + k] * wk;
    }
}

// Output rows [n0, n1) for all B activation rows. The chunk is cut into STREAMS equal segments walked
// side by side (step i computes row i of every segment), so the weight is read as STREAMS long
// contiguous streams at once instead of one: measured 2026-12-02 (wave 7, 1 thread, the synthetic
// model's 99.5 MB of linears streamed from DRAM, /tmp/K1_exp.py) one stream read 10-14 GB/s, four
// 15-19 GB/s (a plain sum over the same bytes: 11-14 GB/s as one stream, 15-21 as four): a core keeps more
// cache-line misses in flight when its prefetchers follow several streams. Visiting the segments' rows
// one after another (the same order without the side-by-side loop) read 5 GB/s: the streams must advance
// together. Activation rows go in pairs while the STREAMS weight rows (6 KB at K = 384) sit in L1, so
// the weight is read from memory once per call.
constexpr int STREAMS = 4;
template <typename W>
void gemv_rows(const float* x, int64_t B, int64_t K, const W* w, int64_t ldw, const float* scales,
               float* y, int64_t N, int64_t n0, int64_t n1) {
  float acc[STREAMS * 2];
  const int64_t len = (n1 - n0) / STREAMS;
  auto put = [&](int64_t n, int64_t b, float v) { y[b * N + n] = scales ? v * scales[n] : v; };
  for (int64_t i = 0; i < len; ++i) {
    const W* wr[STREAMS];
    for (int s = 0; s < STREAMS; ++s) wr[s] = w + (n0 + s * len + i) * ldw;
    for (int64_t b0 = 0; b0 < B; b0 += 2) {
      const float* xb = x + b0 * K;
      if (B - b0 >= 2) {
        seg_dot<STREAMS, 2, W>(xb, K, wr, K, acc);
        for (int s = 0; s < STREAMS; ++s) { put(n0 + s * len + i, b0, acc[2 * s]); put(n0 + s * len + i, b0 + 1, acc[2 * s + 1]); }
      } else {
        seg_dot<STREAMS, 1, W>(xb, K, wr, K, acc);
        for (int s = 0; s < STREAMS; ++s) put(n0 + s * len + i, b0, acc[s]);
      }
    }
  }
  for (int64_t n = n0 + STREAMS * len; n < n1; ++n) {   // the rows past the last whole step
    const W* wr = w + n * ldw;
    for (int64_t b0 = 0; b0 < B; b0 += 2) {
      const float* xb = x + b0 * K;
      if (B - b0 >= 2) {
        seg_dot<1, 2, W>(xb, K, &wr, K, acc);
        put(n, b0, acc[0]); put(n, b0 + 1, acc[1]);
      } else {
        seg_dot<1, 1, W>(xb, K, &wr, K, acc);
        put(n, b0, acc[0]);
      }
    }
  }
}

template <typename W>
void gemv_dispatch(const float* x, int64_t B, int64_t K, const W* w, int64_t ldw, const float* scales,
                   float* y, int64_t N) {
  const int64_t grain = std::max<int64_t>(16, GRAIN_ELEMS / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    gemv_rows<W>(x, B, K, w, ldw, scales, y, N, n0, n1);
  });
}

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous float32 CPU tensor [B, K]");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= MAX_B, "batch must be 1..", MAX_B, ", got ", x.size(0));
  TORCH_CHECK(x.size(1) == K, "x has ", x.size(1), " features, weight expects ", K);
}

at::Tensor gemv_f32(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.is_contiguous(),
              "w must be a contiguous float32 CPU tensor [N, K]");
  const int64_t N = w.size(0), K = w.size(1), B = x.size(0);
  check_x(x, K);
  at::Tensor y = at::empty({B, N}, x.options());
  gemv_dispatch<float>(x.data_ptr<float>(), B, K, w.data_ptr<float>(), K, nullptr, y.data_ptr<float>(), N);
  return y;
}

#if INFERCTL_AVX2
// int8 x int8 path of gemv_int8 (llama.cpp's Q8_0 dot product, ggml_vec_dot_q8_0_q8_0): each activation
// row is quantized once per call in blocks of 32 (absmax/127 scale per block, round to nearest), then
// every weight row is a sequence of 32-wide integer dot products (maddubs on |w| and sign(x, w), madd
// to int32) scaled by the block's activation scale in fp32; columns past the last whole block of 32
// use the fp32 widening loop. 2-4x fewer instructions per weight than widening each weight to fp32.
// x row [K] -> int8 blocks of 32 (first nb*32 values) + one fp32 scale per block (absmax/127, llama.cpp Q8_0)
void quant_row(const float* x, int64_t nb, int8_t* q, float* d) {
  for (int64_t b = 0; b < nb; ++b) {
    const float* p = x + b * 32;
    __m256 m = _mm256_setzero_ps();
    const __m256 sgn = _mm256_set1_ps(-0.f);
    __m256 v[4];
    for (int i = 0; i < 4; ++i) { v[i] = _mm256_loadu_ps(p + 8 * i); m = _mm256_max_ps(m, _mm256_andnot_ps(sgn, v[i])); }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4)); m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float dd = amax / 127.f; d[b] = dd;
    const __m256 inv = _mm256_set1_ps(dd != 0.f ? 1.f / dd : 0.f);
    __m256i i32[4];
    for (int i = 0; i < 4; ++i) i32[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], inv), _MM_ROUND_NEAREST | _MM_FROUND_NO_EXC));
    __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]); __m256i i16b = _mm256_packs_epi32(i32[2], i32[3]);
    __m256i i8 = _mm256_packs_epi16(i16a, i16b);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    i8 = _mm256_permutevar8x32_epi32(i8, perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), i8);
  }
}
// S weight rows (wr[0..S), one per segment, as in gemv_rows) x G quantized activation rows
template <int S, int G>
inline void q8_seg(const int8_t* xq, const float* xd, const float* x, int64_t ldq, int64_t nbd, int64_t K, int64_t nb,
                   const int8_t* const* wr, float* out) {
  if constexpr (S == 4 && G >= 2) {
    // Register-blocked micro-kernel for 2..4 activation rows (wave 8): each weight block's load and |w| serve
    // G rows, each activation block serves the 4 weight rows, and the 4 rows' int32 block sums for one
    // activation row (which share its block scale) are folded into one vector by 2 unpack+add levels
    // (lanes 0-3, and 4-7, hold rows 0-3), then converted and scaled once: one int->fp32 convert and one
    // FMA per 4 (weight row, activation row) pairs a block instead of 4 each, and G accumulators instead of
    // 4G, so no accumulator spills at G = 4. Integer block sums are exact, so only the fp32 order of the
    // per-block terms differs from the 1-row path (it adds lane pairs first): last-bit differences.
    // Measured against the 2-row kernel (1 thread, synthetic shapes, 8-32 rows, CPU time): these unpacks
    // 1.07-1.14x; three hadds 1.03-1.10x; two rows folded by one hadd (2G accumulators) 1.01-1.11x; an
    // fp32 broadcast kernel over a dequantized weight panel (8 activation rows a vector) 0.4-1.0x: this
    // CPU (Zen 3) issues int multiplies and FMAs on the same two pipes, so fp32 FMAs (4 per 32 products)
    // cost more than maddubs + madd (2).
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i w[4], a[4];
      for (int s = 0; s < 4; ++s) {
        w[s] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[s] + b * 32));
        a[s] = _mm256_sign_epi8(w[s], w[s]);
      }
      for (int g = 0; g < G; ++g) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * ldq + b * 32));
        __m256i p[4];
        for (int s = 0; s < 4; ++s) p[s] = dot_u8s8(a[s], _mm256_sign_epi8(xv, w[s]));
        const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
        const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
        const __m256i h = _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
        acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_set1_ps(xd[g * nbd + b]), acc[g]);
      }
    }
    for (int g = 0; g < G; ++g) {
      float t[4];
      _mm_storeu_ps(t, _mm_add_ps(_mm256_castps256_ps128(acc[g]), _mm256_extractf128_ps(acc[g], 1)));
      const float* xr = x + g * K;
      for (int s = 0; s < 4; ++s) {
        float r = t[s];
        for (int64_t k = nb * 32; k < K; ++k) r += xr[k] * (float)wr[s][k];
        out[s * G + g] = r;
      }
    }
    return;
  }
  __m256 acc[S][G];
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < G; ++g) acc[s][g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xv[G];
    for (int g = 0; g < G; ++g) xv[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * ldq + b * 32));
    for (int s = 0; s < S; ++s) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[s] + b * 32));
      const __m256i aw = _mm256_sign_epi8(wv, wv);
      for (int g = 0; g < G; ++g) {
        const __m256i p = dot_u8s8(aw, _mm256_sign_epi8(xv[g], wv));
        acc[s][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(xd[g * nbd + b]), acc[s][g]);
      }
    }
  }
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < G; ++g) {
      float t = hsum8(acc[s][g]);
      const float* xr = x + g * K;
      for (int64_t k = nb * 32; k < K; ++k) t += xr[k] * (float)wr[s][k];
      out[s * G + g] = t;
    }
}

// Output rows [n0, n1) of the int8 weight for the G = 1..4 quantized activation rows starting at b0,
// STREAMS segments side by side (gemv_rows' layout of the work; int8 rows are 4x shorter, so one
// stream is 4x more row switches).
template <int G>
void q8_rows(const int8_t* xq, const float* xd, const float* x, int64_t ldq, int64_t nbd, int64_t K, int64_t nb,
             const int8_t* w, int64_t ldw, const float* sc, float* y, int64_t N, int64_t b0, int64_t n0, int64_t n1) {
  float acc[STREAMS * G];
  const int64_t len = (n1 - n0) / STREAMS;
  for (int64_t i = 0; i < len; ++i) {
    const int8_t* wr[STREAMS];
    for (int s = 0; s < STREAMS; ++s) wr[s] = w + (n0 + s * len + i) * ldw;
    q8_seg<STREAMS, G>(xq, xd, x, ldq, nbd, K, nb, wr, acc);
    for (int s = 0; s < STREAMS; ++s)
      for (int g = 0; g < G; ++g) {
        const int64_t n = n0 + s * len + i;
        y[(b0 + g) * N + n] = acc[s * G + g] * sc[n];
      }
  }
  for (int64_t n = n0 + STREAMS * len; n < n1; ++n) {
    const int8_t* wr = w + n * ldw;
    q8_seg<1, G>(xq, xd, x, ldq, nbd, K, nb, &wr, acc);
    for (int g = 0; g < G; ++g) y[(b0 + g) * N + n] = acc[g] * sc[n];
  }
}

constexpr int64_t Q8_G = 4;   // activation rows per q8_seg pass (q8_seg's register-blocked G >= 2 kernel)

// Interleaved panel (wave 9): 8 weight rows repacked so that one 32-byte vector holds 4 consecutive bytes
// of each of the 8 rows ("8 rows x 4 bytes"; block b, step j at il[(b * 8 + j) * 32]). One activation's 4
// bytes, broadcast to the 8 lanes, then feed all 8 rows: sign + maddubs + madd + add per 32 products and
// the int32 lanes ARE the 8 rows' sums (no fold), one convert + FMA per block and activation row for 8
// weight rows, and the 8 outputs of an activation row are one vector store.
constexpr int64_t IL_ROWS = 8;
#ifndef INFERCTL_IL_MIN_B
#define INFERCTL_IL_MIN_B 4
#endif
// Activation rows from which gemv_int8 takes q8_il (measured 2026-12-02, wave 9, 1 thread, CPU time, synthetic
// layer shapes, vs q8_seg: 2 rows 0.73-0.84x, 4 rows 0.96-1.48x, 6-32 rows 1.1-2.1x; the DRAM/L3-streamed
// 384x32000 classifier 0.91-1.0x at 4 rows, 0.95-1.7x at 6-32: noisy). Batch 1 keeps q8_seg's 4 streams.
constexpr int64_t IL_MIN_B = INFERCTL_IL_MIN_B;
// With VNNI the packed bytes are w + 128 (w XOR 0x80, as unsigned: vpdpbusd's unsigned operand), and q8_il
// takes 128 * (the activation block's sum) back off each block's exact int32 sum.
inline void il_pack8(const int8_t* w, int64_t ldw, int64_t nb, int8_t* il) {
#if INFERCTL_VNNI
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
#define IL_STORE(o, v) _mm256_storeu_si256(o, _mm256_xor_si256(v, bias))
#else
#define IL_STORE(o, v) _mm256_storeu_si256(o, v)
#endif
  for (int64_t b = 0; b < nb; ++b) {
    __m256i r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i * ldw + b * 32));
    // 8x8 transpose of 32-bit elements: out[j] = dword j of rows 0..7
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    __m256i* o = reinterpret_cast<__m256i*>(il + b * 256);
    IL_STORE(o + 0, _mm256_permute2x128_si256(u0, u4, 0x20));
    IL_STORE(o + 1, _mm256_permute2x128_si256(u1, u5, 0x20));
    IL_STORE(o + 2, _mm256_permute2x128_si256(u2, u6, 0x20));
    IL_STORE(o + 3, _mm256_permute2x128_si256(u3, u7, 0x20));
    IL_STORE(o + 4, _mm256_permute2x128_si256(u0, u4, 0x31));
    IL_STORE(o + 5, _mm256_permute2x128_si256(u1, u5, 0x31));
    IL_STORE(o + 6, _mm256_permute2x128_si256(u2, u6, 0x31));
    IL_STORE(o + 7, _mm256_permute2x128_si256(u3, u7, 0x31));
  }
#undef IL_STORE
}

// 8 interleaved weight rows (il, il_pack8's layout) x G quantized activation rows; y rows n..n+7 of the G
// activation rows starting at xq/xd/x (y already offset to activation row 0 of the group, row stride N).
// Numerics: each block's int32 sum is exact and scaled once (llama.cpp's order: sum_b d_x[b] * isum_b, then
// the row scale), so a row's value does not depend on G or on the other rows of the call; it differs from
// q8_seg's (1-3 rows) in the last fp32 bits.
// xs: with VNNI, 128 * the sum of each quantized activation block (row stride nbd), else unused.
// VNNI (2026-12-03, a Zen 4 with AVX512-VNNI): one vpdpbusd per 32 products on the biased bytes instead of
// sign + maddubs + madd + add; the 8 steps of a block alternate two accumulators per activation row
// (vpdpbusd's latency), and the block's int32 sum, exact either way, is the same integer as below.
template <int G>
inline void q8_il(const int8_t* il, const int8_t* xq, const float* xd, const int32_t* xs, const float* x,
                  int64_t ldq, int64_t nbd, int64_t K, int64_t nb, const int8_t* w, int64_t ldw, const float* sc,
                  float* y, int64_t N) {
  __m256 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
#if INFERCTL_VNNI
  for (int64_t b = 0; b < nb; ++b) {
    __m256i is[G][2];
    for (int g = 0; g < G; ++g) is[g][0] = is[g][1] = _mm256_setzero_si256();
    const int8_t* wb = il + b * 256;
    for (int j = 0; j < 8; ++j) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
      for (int g = 0; g < G; ++g) {
        int32_t x4;
        std::memcpy(&x4, xq + g * ldq + b * 32 + 4 * j, 4);
        is[g][j & 1] = INFERCTL_DPBUSD(is[g][j & 1], wv, _mm256_set1_epi32(x4));
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m256i t = _mm256_sub_epi32(_mm256_add_epi32(is[g][0], is[g][1]), _mm256_set1_epi32(xs[g * nbd + b]));
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(xd[g * nbd + b]), acc[g]);
    }
  }
#else
  (void)xs;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i is[G];
    for (int g = 0; g < G; ++g) is[g] = _mm256_setzero_si256();
    const int8_t* wb = il + b * 256;
    for (int j = 0; j < 8; ++j) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
      const __m256i aw = _mm256_sign_epi8(wv, wv);
      for (int g = 0; g < G; ++g) {
        int32_t x4;
        std::memcpy(&x4, xq + g * ldq + b * 32 + 4 * j, 4);
        const __m256i xv = _mm256_set1_epi32(x4);
        is[g] = _mm256_add_epi32(is[g], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones));
      }
    }
    for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[g]), _mm256_set1_ps(xd[g * nbd + b]), acc[g]);
  }
#endif
  const __m256 s = _mm256_loadu_ps(sc);
  for (int g = 0; g < G; ++g) {
    if (nb * 32 < K) {   // columns past the last whole block: fp32, as q8_seg
      float t[8];
      _mm256_storeu_ps(t, acc[g]);
      const float* xr = x + g * K;
      for (int r = 0; r < 8; ++r)
        for (int64_t k = nb * 32; k < K; ++k) t[r] += xr[k] * (float)w[r * ldw + k];
      acc[g] = _mm256_loadu_ps(t);
    }
    _mm256_storeu_ps(y + g * N, _mm256_mul_ps(acc[g], s));
  }
}
// Activation rows per q8_il pass (VNNI, 1 thread, synthetic shapes, 8-32 rows: 8 rows a pass ran 1.3-1.9x slower
// than 4, its 24 accumulators spilled).
constexpr int64_t IL_G = 4;
using QIl = void (*)(const int8_t*, const int8_t*, const float*, const int32_t*, const float*, int64_t, int64_t,
                     int64_t, int64_t, const int8_t*, int64_t, const float*, float*, int64_t);
constexpr QIl IL_KERNELS[IL_G] = {q8_il<1>, q8_il<2>, q8_il<3>, q8_il<4>};
void gemv_int8_q8(const float* xp, int64_t B, int64_t K, const int8_t* wp, int64_t ldw, const float* sp,
                  float* yp, int64_t N) {
  const int64_t nb = K / 32;
  std::vector<int8_t> xq(static_cast<size_t>(B * std::max<int64_t>(nb, 1) * 32));
  std::vector<float> xd(static_cast<size_t>(B * std::max<int64_t>(nb, 1)));
  for (int64_t b = 0; b < B; ++b) quant_row(xp + b * K, nb, xq.data() + b * nb * 32, xd.data() + b * nb);
  std::vector<int32_t> xs;   // q8_il's bias term (VNNI): 128 * each block's sum
  if (INFERCTL_VNNI && B >= IL_MIN_B) {
    xs.resize(xd.size());
    for (int64_t i = 0; i < B * nb; ++i) {
      int32_t t = 0;
      for (int k = 0; k < 32; ++k) t += xq[i * 32 + k];
      xs[i] = 128 * t;
    }
  }
  const int64_t grain = std::max<int64_t>(16, GRAIN_ELEMS / std::max<int64_t>(K, 1));
  // Output rows in L2-sized panels (L2_PANEL_BYTES of int8 weight): every pair of quantized activation
  // rows passes over a panel while it sits in L2, so each weight byte comes from memory once per call
  // however many groups there are (the whole chunk was re-read per group before: 1.1-1.2x slower on the
  // 12 MB 384x32000 classifier at 16-64 rows; the per-pair integer ops, not the weight reads, bound the rest).
  const int64_t panel = std::max<int64_t>(16, L2_PANEL_BYTES / std::max<int64_t>(ldw, 1));
  const bool il = B >= IL_MIN_B && nb > 0;
  // output rows [r0, r1) for every activation row, in groups of Q8_G, with the 4-stream kernel
  auto rows_4stream = [&](int64_t r0, int64_t r1) {
    for (int64_t b0 = 0; b0 < B; b0 += Q8_G) {
      const int8_t* xqb = xq.data() + b0 * nb * 32;
      const float* xdb = xd.data() + b0 * nb;
      const float* xb = xp + b0 * K;
      switch (std::min<int64_t>(Q8_G, B - b0)) {
        case 4: q8_rows<4>(xqb, xdb, xb, nb * 32, nb, K, nb, wp, ldw, sp, yp, N, b0, r0, r1); break;
        case 3: q8_rows<3>(xqb, xdb, xb, nb * 32, nb, K, nb, wp, ldw, sp, yp, N, b0, r0, r1); break;
        case 2: q8_rows<2>(xqb, xdb, xb, nb * 32, nb, K, nb, wp, ldw, sp, yp, N, b0, r0, r1); break;
        default: q8_rows<1>(xqb, xdb, xb, nb * 32, nb, K, nb, wp, ldw, sp, yp, N, b0, r0, r1); break;
      }
    }
  };
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    std::vector<int8_t> ilbuf;
    if (il) ilbuf.resize(static_cast<size_t>(nb * 256));
    for (int64_t p0 = n0; p0 < n1; p0 += panel) {
      const int64_t p1 = std::min(n1, p0 + panel);
      if (il) {
        // 8 weight rows at a time: repacked into ilbuf (L1, 256 bytes a block of 32 columns: ~1 shuffle a
        // weight vector, paid once per call however many activation rows pass), then every activation row
        // passes over them; with this order the L2 panel above only bounds a thread's chunk walk
        int64_t n = p0;
        for (; n + IL_ROWS <= p1; n += IL_ROWS) {
          il_pack8(wp + n * ldw, ldw, nb, ilbuf.data());
          if (n + 2 * IL_ROWS <= p1) {   // the next 8 rows from memory while these run (one stream: the
            const int8_t* nx = wp + (n + IL_ROWS) * ldw;   // weight-streaming classifier needs it)
            for (int64_t off = 0; off < IL_ROWS * ldw; off += 64) _mm_prefetch(reinterpret_cast<const char*>(nx + off), _MM_HINT_T0);
          }
          for (int64_t b0 = 0; b0 < B; b0 += IL_G) {
            const int32_t* xsb = xs.empty() ? nullptr : xs.data() + b0 * nb;
            IL_KERNELS[std::min<int64_t>(IL_G, B - b0) - 1](ilbuf.data(), xq.data() + b0 * nb * 32, xd.data() + b0 * nb,
                xsb, xp + b0 * K, nb * 32, nb, K, nb, wp + n * ldw, ldw, sp + n, yp + b0 * N + n, N);
          }
        }
        if (n < p1) rows_4stream(n, p1);   // the last 1-7 rows: the 4-stream kernel
        continue;
      }
      rows_4stream(p0, p1);
    }
  });
}
#endif

at::Tensor gemv_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, int64_t K) {
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kChar && q.dim() == 2 && q.is_contiguous(),
              "q must be a contiguous int8 CPU tensor [N, K_padded]");
  const int64_t N = q.size(0), B = x.size(0);
  TORCH_CHECK(K >= 1 && K <= q.size(1), "in_features ", K, " outside 1..", q.size(1));
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == N,
              "scales must be contiguous float32 [N]");
  check_x(x, K);
  at::Tensor y = at::empty({B, N}, x.options());
#if INFERCTL_AVX2
  gemv_int8_q8(x.data_ptr<float>(), B, K, q.data_ptr<int8_t>(), q.size(1), scales.data_ptr<float>(),
               y.data_ptr<float>(), N);
#else
  gemv_dispatch<int8_t>(x.data_ptr<float>(), B, K, q.data_ptr<int8_t>(), q.size(1), scales.data_ptr<float>(),
                        y.data_ptr<float>(), N);
#endif
  return y;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous float32 CPU tensor [T, D]");
  const int64_t T = x.size(0), D = x.size(1);
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.numel() == D, "w must be float32 [D]");
  at::Tensor y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, T, std::max<int64_t>(1, GRAIN_ELEMS / std::max<int64_t>(D, 1)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* r = xp + t * D;
      float* o = yp + t * D;
      float ss = 0.f;
      int64_t d = 0;
#if INFERCTL_AVX2
      __m256 a = _mm256_setzero_ps();
      for (; d + 8 <= D; d += 8) {
        __m256 v = _mm256_loadu_ps(r + d);
        a = _mm256_fmadd_ps(v, v, a);
      }
      ss = hsum8(a);
#endif
      for (; d < D; ++d) ss += r[d] * r[d];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(D) + static_cast<float>(eps));
      for (d = 0; d < D; ++d) o[d] = (r[d] * inv) * wp[d];
    }
  });
  return y;
}

at::Tensor silu_mul(const at::Tensor& gu) {
  TORCH_CHECK(gu.device().is_cpu() && gu.scalar_type() == at::kFloat && gu.dim() == 2 && gu.is_contiguous(),
              "gu must be a contiguous float32 CPU tensor [T, 2H]");
  TORCH_CHECK(gu.size(1) % 2 == 0, "gu's last dimension must be even, got ", gu.size(1));
  const int64_t T = gu.size(0), H = gu.size(1) / 2;
  at::Tensor y = at::empty({T, H}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, T, std::max<int64_t>(1, GRAIN_ELEMS / std::max<int64_t>(H, 1)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = gp + t * 2 * H;
      const float* u = g + H;
      float* o = yp + t * H;
      for (int64_t h = 0; h < H; ++h) o[h] = g[h] / (1.f + std::exp(-g[h])) * u[h];
    }
  });
  return y;
}

bool has_avx2() { return INFERCTL_AVX2 != 0; }

// How many threads an at::parallel_for over n items (grain 1) runs its chunks on: torch.get_num_threads()
// capped at n when the extension is built with OpenMP (engine.cpu_kernels.CFLAGS), 1 without it.
int64_t parallel_threads(int64_t n) {
  std::vector<int64_t> seen(static_cast<size_t>(std::max<int64_t>(n, 1)), -1);
  at::parallel_for(0, n, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) seen[i] = at::get_thread_num();
  });
  std::sort(seen.begin(), seen.end());
  return std::unique(seen.begin(), seen.end()) - seen.begin();
}

}  // namespace

// Registered as torch.ops.inferctl_cpu.* (no pybind: the torch/extension.h headers doubled the first-use compile).
TORCH_LIBRARY(inferctl_cpu, m) {
  m.def("gemv_f32(Tensor x, Tensor w) -> Tensor", &gemv_f32);
  m.def("gemv_int8(Tensor x, Tensor q, Tensor scales, int k) -> Tensor", &gemv_int8);
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm);
  m.def("silu_mul(Tensor gu) -> Tensor", &silu_mul);
  m.def("has_avx2() -> bool", &has_avx2);
  m.def("parallel_threads(int n) -> int", &parallel_threads);
}
