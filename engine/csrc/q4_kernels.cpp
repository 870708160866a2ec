// 4-bit GEMV/GEMM over GGUF Q4_1 blocks kept as the file stores them (inferctl.engine.q4_kernels).
//
// q4_matmul   y[B, N] = x[B, K] @ W[N, K]^T, W given as blocks uint8 [N, nb * 20], nb = ceil(K / 32)
// q4_dequant  W as float32 [N, K] (long prefills run torch's GEMM on it)
//
// Block layout (ggml block_q4_1, ggml-common.h; dequantize_row_q4_1 in ggml-quants.c): fp16 d,
// fp16 m, 16 bytes qs; value j (0..15) is qs[j] & 0xF, value j + 16 is qs[j] >> 4, and the weight is
// d * q + m computed in fp32 (d, m widened from fp16 exactly). Q4_0 blocks are converted to this
// form at load (m = -8 d, exact in fp16). The weight row is dequantized in registers (AVX2: nibbles
// -> int32 -> fp32 -> FMA with d and m) and multiplied with fp32 activations; nothing is rounded
// to bf16. Activation rows are taken in groups of up to 4 per pass over a weight row (the row,
// 360 bytes at K = 576, stays in L1 for the next group), so the weights stream from memory once.
// Threads: at::parallel_for over output rows (torch's pool, torch.set_num_threads applies; no
// other thread pool). Inputs are checked with TORCH_CHECK (RuntimeError, never a crash).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INFERCTL_Q4_AVX2 1
#else
#define INFERCTL_Q4_AVX2 0
#endif

namespace {

constexpr int64_t QK = 32;         // values per block (ggml QK4_1)
constexpr int64_t BLOCK_BYTES = 20;  // fp16 d + fp16 m + 16 bytes of nibbles
constexpr int64_t GRAIN_WEIGHTS = 1 << 16;

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

inline float code_at(const uint8_t* qs, int64_t i) { return static_cast<float>(i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4); }

#if INFERCTL_Q4_AVX2
using inferctl_simd::hsum8;

// The 32 weights of one block as 4 x 8 fp32 (values 0-7, 8-15, 16-23, 24-31): d * q + m. Each
// half of qs is widened byte -> int32 straight from memory; low nibble = v & 15, high = v >> 4.
inline void dequant_block(const uint8_t* blk, __m256 w[4]) {
  int32_t dm_bits;
  std::memcpy(&dm_bits, blk, 4);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));  // [d, m, 0, 0], F16C: exact widening
  const __m256 d = _mm256_broadcastss_ps(dm);
  const __m256 m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
  const __m256i mask = _mm256_set1_epi32(0x0F);
  const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 4)));
  const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 12)));
  w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b0, mask)), d, m);
  w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b1, mask)), d, m);
  w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), d, m);
  w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4)), d, m);
}
#endif

// out[b] = sum_k x[b, k] * W[row, k] for G activation rows (stride ldx), one weight row of nb blocks.
template <int G>
inline void row_dot(const float* x, int64_t ldx, const uint8_t* row, int64_t K, float* out) {
  const int64_t full = K / QK;
  int64_t j = 0;
#if INFERCTL_Q4_AVX2
  constexpr int A = G <= 2 ? 4 : 2;  // independent accumulators per activation row (FMA latency)
  __m256 acc[G][A];
  for (int b = 0; b < G; ++b)
    for (int a = 0; a < A; ++a) acc[b][a] = _mm256_setzero_ps();
  for (; j < full; ++j) {
    const uint8_t* blk = row + j * BLOCK_BYTES;
    if ((j & 3) == 0) __builtin_prefetch(blk + 256);
    __m256 w[4];
    dequant_block(blk, w);
    const int64_t k = j * QK;
    for (int b = 0; b < G; ++b)
      for (int v = 0; v < 4; ++v)
        acc[b][v % A] = _mm256_fmadd_ps(_mm256_loadu_ps(x + b * ldx + k + 8 * v), w[v], acc[b][v % A]);
  }
  for (int b = 0; b < G; ++b) {
    __m256 s = acc[b][0];
    for (int a = 1; a < A; ++a) s = _mm256_add_ps(s, acc[b][a]);
    out[b] = hsum8(s);
  }
#else
  for (int b = 0; b < G; ++b) out[b] = 0.f;
#endif
  for (; j * QK < K; ++j) {  // scalar: every block without AVX2, else only a partial last block
    const uint8_t* blk = row + j * BLOCK_BYTES;
    const float d = half_at(blk), m = half_at(blk + 2);
    const int64_t n = std::min<int64_t>(QK, K - j * QK);
    for (int64_t i = 0; i < n; ++i) {
      const float w = code_at(blk + 4, i) * d + m;
      for (int b = 0; b < G; ++b) out[b] += x[b * ldx + j * QK + i] * w;
    }
  }
}

void check_blocks(const at::Tensor& blocks, int64_t K) {
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.dim() == 2 &&
                  blocks.is_contiguous(),
              "blocks must be a contiguous uint8 CPU tensor [N, nb * 20]");
  TORCH_CHECK(K >= 1 && blocks.size(1) == (K + QK - 1) / QK * BLOCK_BYTES, "blocks have ", blocks.size(1),
              " bytes per row; K = ", K, " needs ", (K + QK - 1) / QK * BLOCK_BYTES);
}

at::Tensor q4_matmul(const at::Tensor& x, const at::Tensor& blocks, int64_t K) {
  check_blocks(blocks, K);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous float32 CPU tensor [B, K]");
  TORCH_CHECK(x.size(1) == K, "x has ", x.size(1), " features, the weight expects ", K);
  const int64_t B = x.size(0), N = blocks.size(0), ldw = blocks.size(1);
  at::Tensor y = at::empty({B, N}, x.options());
  if (B == 0 || N == 0) return y;
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = blocks.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(16, GRAIN_WEIGHTS / (K * std::min<int64_t>(B, 4)));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    float acc[4];
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* row = wp + n * ldw;
      for (int64_t b0 = 0; b0 < B; b0 += 4) {
        const int64_t g = std::min<int64_t>(4, B - b0);
        const float* xb = xp + b0 * K;
        switch (g) {
          case 1: row_dot<1>(xb, K, row, K, acc); break;
          case 2: row_dot<2>(xb, K, row, K, acc); break;
          case 3: row_dot<3>(xb, K, row, K, acc); break;
          default: row_dot<4>(xb, K, row, K, acc); break;
        }
        for (int64_t b = 0; b < g; ++b) yp[(b0 + b) * N + n] = acc[b];
      }
    }
  });
  return y;
}

// The whole weight as float32 [N, K] (long prefills: the caller hands it to torch's GEMM).
at::Tensor q4_dequant(const at::Tensor& blocks, int64_t K) {
  check_blocks(blocks, K);
  const int64_t N = blocks.size(0), ldw = blocks.size(1);
  at::Tensor y = at::empty({N, K}, blocks.options().dtype(at::kFloat));
  const uint8_t* wp = blocks.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, std::max<int64_t>(1, GRAIN_WEIGHTS / K), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* row = wp + n * ldw;
      float* out = yp + n * K;
      int64_t j = 0;
#if INFERCTL_Q4_AVX2
      for (; (j + 1) * QK <= K; ++j) {
        __m256 w[4];
        dequant_block(row + j * BLOCK_BYTES, w);
        for (int v = 0; v < 4; ++v) _mm256_storeu_ps(out + j * QK + 8 * v, w[v]);
      }
#endif
      for (int64_t k = j * QK; k < K; ++k) {
        const uint8_t* blk = row + (k / QK) * BLOCK_BYTES;
        out[k] = code_at(blk + 4, k % QK) * half_at(blk) + half_at(blk + 2);
      }
    }
  });
  return y;
}

bool q4_has_avx2() { return INFERCTL_Q4_AVX2 != 0; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferctl_cpu, m) {
  m.def("q4_matmul(Tensor x, Tensor blocks, int k) -> Tensor", &q4_matmul);
  m.def("q4_dequant(Tensor blocks, int k) -> Tensor", &q4_dequant);
  m.def("q4_has_avx2() -> bool", &q4_has_avx2);
}
