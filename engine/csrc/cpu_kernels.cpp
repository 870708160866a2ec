// CPU kernels for small-batch decode (inferctl.engine.cpu_kernels loads this at first use).
//
// gemv_f32   y[B, N] = x[B, K] @ W[N, K]^T          (W in nn.Linear's [out, in] layout)
// gemv_int8  y[B, N] = (x[B, K] @ Q[N, :K]^T) * s[N] (Q int8 [out, in_padded], s fp32 per output row)
//            x quantized to int8 per block of 32 (llama.cpp Q8_0) where AVX2 is there
// rms_norm   y[T, D] = x * 1/sqrt(mean(x^2) + eps) * w   (Zhang & Sennrich 2019)
// silu_mul   y[T, H] = silu(gu[:, :H]) * gu[:, H:]     (SwiGLU, Shazeer 2020)
//
// Each output row of a GEMV is a dot product over one contiguous row of W, so the weight is read
// once, front to back, by each thread (the layout llama.cpp's ggml_vec_dot_f32 streams). Up to
// MAX_B activation rows share each weight row (in passes of 4 while the row sits in L1). Python sends
// fp32 where cpu_kernels.f32_kernel_wins (up to 8 rows at 1 thread, 16 at more: MKL's GEMM wins above
// that) and int8 up to MAX_BATCH_INT8 (64: torch's int8 kernel takes bf16 activations, emulated
// without bf16 hardware); the fused decode op (decode_step.cpp) calls both with up to 64 rows.
// Threads: at::parallel_for over output rows
// (respects torch.set_num_threads). AVX2+FMA intrinsics when the compiler targets them
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

inline __m256 load_i8x8(const int8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
#endif

// One output row n for B activation rows: out[b] = sum_k x[b, k] * w[k]. A = independent
// accumulators per activation row (FMA latency hiding: 4 at B=1, 2 above, within 16 ymm registers).
template <int B, typename W>
inline void row_dot(const float* x, int64_t ldx, const W* w, int64_t K, float* out) {
  int64_t k = 0;
#if INFERCTL_AVX2
  constexpr int A = B == 1 ? 4 : 2;
  __m256 acc[B][A];
  for (int b = 0; b < B; ++b)
    for (int a = 0; a < A; ++a) acc[b][a] = _mm256_setzero_ps();
  for (; k + 8 * A <= K; k += 8 * A) {
    __m256 wv[A];
    for (int a = 0; a < A; ++a) {
      if constexpr (std::is_same_v<W, float>) {
        wv[a] = _mm256_loadu_ps(w + k + 8 * a);
      } else {
        wv[a] = load_i8x8(w + k + 8 * a);
      }
    }
    for (int b = 0; b < B; ++b)
      for (int a = 0; a < A; ++a)
        acc[b][a] = _mm256_fmadd_ps(_mm256_loadu_ps(x + b * ldx + k + 8 * a), wv[a], acc[b][a]);
  }
  for (; k + 8 <= K; k += 8) {
    __m256 wv;
    if constexpr (std::is_same_v<W, float>) {
      wv = _mm256_loadu_ps(w + k);
    } else {
      wv = load_i8x8(w + k);
    }
    for (int b = 0; b < B; ++b) acc[b][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + b * ldx + k), wv, acc[b][0]);
  }
  for (int b = 0; b < B; ++b) {
    __m256 s = acc[b][0];
    for (int a = 1; a < A; ++a) s = _mm256_add_ps(s, acc[b][a]);
    out[b] = hsum8(s);
  }
#else
  for (int b = 0; b < B; ++b) out[b] = 0.f;
#endif
  for (; k < K; ++k) {
    const float wk = static_cast<float>(w[k]);
    for (int b = 0; b < B; ++b) out[b] += x[b * ldx + k] * wk;
  }
}

// Output rows [n0, n1) for all B activation rows, in groups of up to 4 per pass over a weight row
// (the row, 1-2 KB, stays in L1 for the second group: the weight is read from memory once).
template <typename W>
void gemv_rows(const float* x, int64_t B, int64_t K, const W* w, int64_t ldw, const float* scales,
               float* y, int64_t N, int64_t n0, int64_t n1) {
  float acc[4];
  for (int64_t n = n0; n < n1; ++n) {
    const W* wr = w + n * ldw;
    if (n + 4 < n1) __builtin_prefetch(w + (n + 4) * ldw);
    const float s = scales ? scales[n] : 1.f;
    for (int64_t b0 = 0; b0 < B; b0 += 4) {
      const int64_t g = std::min<int64_t>(4, B - b0);
      const float* xb = x + b0 * K;
      switch (g) {
        case 1: row_dot<1, W>(xb, K, wr, K, acc); break;
        case 2: row_dot<2, W>(xb, K, wr, K, acc); break;
        case 3: row_dot<3, W>(xb, K, wr, K, acc); break;
        default: row_dot<4, W>(xb, K, wr, K, acc); break;
      }
      for (int64_t b = 0; b < g; ++b) y[(b0 + b) * N + n] = scales ? acc[b] * s : acc[b];
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
template <int G>
void q8_rows(const int8_t* xq, const float* xd, const float* x, int64_t ldq, int64_t nbd, int64_t K, int64_t nb,
          const int8_t* w, int64_t ldw, const float* sc, float* y, int64_t N, int64_t b0, int64_t n0, int64_t n1) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* wr = w + n * ldw;
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + b * 32));
      const __m256i aw = _mm256_sign_epi8(wv, wv);
      for (int g = 0; g < G; ++g) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * ldq + b * 32));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones);
        acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(xd[g * nbd + b]), acc[g]);
      }
    }
    for (int g = 0; g < G; ++g) {
      float t = hsum8(acc[g]);
      const float* xr = x + g * K;
      for (int64_t k = nb * 32; k < K; ++k) t += xr[k] * (float)wr[k];
      y[(b0 + g) * N + n] = t * sc[n];
    }
  }
}

void gemv_int8_q8(const float* xp, int64_t B, int64_t K, const int8_t* wp, int64_t ldw, const float* sp,
                  float* yp, int64_t N) {
  const int64_t nb = K / 32;
  std::vector<int8_t> xq(static_cast<size_t>(B * std::max<int64_t>(nb, 1) * 32));
  std::vector<float> xd(static_cast<size_t>(B * std::max<int64_t>(nb, 1)));
  for (int64_t b = 0; b < B; ++b) quant_row(xp + b * K, nb, xq.data() + b * nb * 32, xd.data() + b * nb);
  const int64_t grain = std::max<int64_t>(16, GRAIN_ELEMS / std::max<int64_t>(K, 1));
  // Output rows in L2-sized panels (L2_PANEL_BYTES of int8 weight): every group of 4 quantized activation
  // rows passes over a panel while it sits in L2, so each weight byte comes from memory once per call
  // however many groups there are (the whole chunk was re-read per group before: 1.1-1.2x slower on the
  // 12 MB 384x32000 classifier at 16-64 rows; the per-pair integer ops, not the weight reads, bound the rest).
  const int64_t panel = std::max<int64_t>(16, L2_PANEL_BYTES / std::max<int64_t>(ldw, 1));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t p0 = n0; p0 < n1; p0 += panel) {
      const int64_t p1 = std::min(n1, p0 + panel);
      for (int64_t b0 = 0; b0 < B; b0 += 4) {
        const int64_t g = std::min<int64_t>(4, B - b0);
        const int8_t* xqb = xq.data() + b0 * nb * 32;
        const float* xdb = xd.data() + b0 * nb;
        const float* xb = xp + b0 * K;
        switch (g) {
          case 1: q8_rows<1>(xqb, xdb, xb, nb * 32, nb, K, nb, wp, ldw, sp, yp, N, b0, p0, p1); break;
          case 2: q8_rows<2>(xqb, xdb, xb, nb * 32, nb, K, nb, wp, ldw, sp, yp, N, b0, p0, p1); break;
          case 3: q8_rows<3>(xqb, xdb, xb, nb * 32, nb, K, nb, wp, ldw, sp, yp, N, b0, p0, p1); break;
          default: q8_rows<4>(xqb, xdb, xb, nb * 32, nb, K, nb, wp, ldw, sp, yp, N, b0, p0, p1); break;
        }
      }
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

}  // namespace

// Registered as torch.ops.inferctl_cpu.* (no pybind: the torch/extension.h headers doubled the first-use compile).
TORCH_LIBRARY(inferctl_cpu, m) {
  m.def("gemv_f32(Tensor x, Tensor w) -> Tensor", &gemv_f32);
  m.def("gemv_int8(Tensor x, Tensor q, Tensor scales, int k) -> Tensor", &gemv_int8);
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm);
  m.def("silu_mul(Tensor gu) -> Tensor", &silu_mul);
  m.def("has_avx2() -> bool", &has_avx2);
}
