// One C++ call for every decoder layer of a decode step (inferctl.engine.fused_decode drives it).
//
// decode_layers(x[B, dim], cos[B, D], sin[B, D], k_pool, v_pool [L, Hkv, NB, bs, D], slot_mapping[B],
//               block_tables[B, maxb], seq_lens[B], attn_norm[L], ffn_norm[L], weights[4L], scales[4L],
//               n_heads, n_kv_heads, rope_style, eps, scale, torch_mm_mask
//               [, final_norm[dim], out_w, out_s, out_torch_mm]) -> x'[B, dim], or logits[B, vocab] with final_norm
//
// decode_tokens(ids[B], positions[B], emb[vocab, dim'], emb_scales, cos_table[n, D], sin_table[n, D], <the same
//               arguments from k_pool on>) -> the same result, with x = the embedding rows of `ids` (float32 rows of
//               any stride, or int8 rows times their float32 scale: the float32 product engine.model.LlamaModel.embed
//               computes, bit for bit) and cos/sin = the rows `positions` of the model's RoPE tables (rope_table):
//               the embedding lookup and the two RoPE index_selects read inside the op (issue 12, wave 9).
// greedy_logprobs(logits[B, V]) -> float64 [2B]: (argmax token, its log_softmax) per row, the argmax the first
//               maximal index (a NaN counts as the maximum, as torch.argmax), the logprob read from ATen's own
//               log_softmax (the value torch.log_softmax gives, bit for bit): engine.sampler.greedy_sample.
// decode_layers / decode_tokens with greedy_out (float64 [2B], needs final_norm): the same logits returned, and
//               greedy_logprobs' values of them written into greedy_out in the same call (issue 12, wave 10).
//
// Every sequence contributes exactly one token (B = T <= 64). Per layer, the same math as
// engine.model.LlamaModel.forward's per-op path (fp32 throughout):
//   h = rms_norm(x) ; qkv = h @ Wqkv^T ; RoPE on q and k (x*cos + partner(x)*sin, the model's
//   rope_tables: "interleaved" swaps pairs (0,1),(2,3)..., "half" pairs (i, i+D/2)) ; k, v written
//   into the pool at slot_mapping ; attention of each query head over its sequence's context read
//   IN PLACE through its block table (scores = q.k * scale, softmax with the max subtracted, then
//   p @ v; GQA: query head h reads kv head h / (H/Hkv)) ; x += o @ Wo^T ; h = rms_norm(x) ;
//   gu = h @ W13^T ; x += (silu(g) * u) @ W2^T.
// With final_norm given (the model's output head, engine.fused_decode.head_tensors): after the last layer
// logits = rms_norm(x, final_norm) @ out_w^T, the classifier in any of the layer linears' storage kinds
// (out_s as their scales; out_torch_mm as a torch_mm_mask bit), so the step's largest GEMV (the
// 384x32000 classifier of the 99.5 MB model is half its weights) runs on the same kernels and threads.
// The GEMVs are the extension's own gemv_f32 / gemv_int8 / q4_matmul (csrc/cpu_kernels.cpp,
// csrc/q4_kernels.cpp), called through
// the dispatcher, so this file shares their inner loops without copying them; bit j of torch_mm_mask
// (j = 0 wqkv, 1 wo, 2 w13, 3 w2) sends that fp32 linear to a GEMM instead (a GEMM wins there from
// a few rows: engine.cpu_kernels.f32_kernel_wins, the one predicate, decides in Python); bit j + 4 makes
// that GEMM oneDNN's (engine.onednn) rather than torch's default (MKL), bit 8 the head's
// (engine.fused_decode.mm_mask). weights[4i..4i+3] are
// layer i's wqkv, wo, w13, w2: float32 [out, in] with an empty scales entry, or int8 [out, in_padded]
// with float32 scales [out] (engine.quant's per-channel layout), or uint8 GGUF Q4_1 blocks [out, ceil(in/32)*20]
// with an empty scales entry (engine.q4_kernels, computed by its q4_matmul).
// Threads: at::parallel_for only (query heads in attention, rows in the GEMVs): never another pool.
// Every input is checked with TORCH_CHECK (a RuntimeError, never a crash), block ids and slots too.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "paged_attention.h"
#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define INFERCTL_DS_AVX2 1
#else
#define INFERCTL_DS_AVX2 0
#endif

namespace {

constexpr int64_t MAX_B = 64;       // sequences per call (cpu_kernels.MAX_DECODE_BATCH; gemv_f32/gemv_int8's MAX_B)
constexpr int64_t MAX_HEAD_DIM = 512;
constexpr int64_t kOneDnnShift = 4;         // torch_mm_mask bit j + 4: linear j's GEMM is oneDNN's (fused_decode)
constexpr int64_t kHeadOneDnnBit = 1 << 8;  // the same for the head's GEMM (fused_decode.HEAD_ONEDNN_BIT)
constexpr int64_t ATTN_GRAIN = 1 << 14;   // score multiply-adds per parallel chunk of heads

#if INFERCTL_DS_AVX2
using inferctl_simd::hsum8;
#endif

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.f;
#if INFERCTL_DS_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  s = hsum8(acc);
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[n] += a * x[n]
inline void axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if INFERCTL_DS_AVX2
  const __m256 av = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

// the engine's rms_norm kernel's formula: (x * 1/sqrt(mean(x^2) + eps)) * w, row by row
void rms_norm_rows(const float* x, const float* w, float* y, int64_t B, int64_t dim, float eps) {
  for (int64_t b = 0; b < B; ++b) {
    const float* r = x + b * dim;
    float* o = y + b * dim;
    const float inv = 1.f / std::sqrt(dot(r, r, dim) / static_cast<float>(dim) + eps);
    for (int64_t d = 0; d < dim; ++d) o[d] = (r[d] * inv) * w[d];
  }
}

// y = x @ W^T through the extension's registered GEMV ops (fp32 when scales is empty, else int8), or
// a GEMM for an fp32 weight when `torch_mm` (the caller's cpu_kernels.f32_kernel_wins said no for this
// batch and shape): oneDNN's (mkldnn::_linear_pointwise, on torch's own thread pool) when `onednn`
// (engine.fused_decode.mm_mask's bit for that linear), else torch's (MKL)
at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& s, bool torch_mm, bool onednn) {
  if (torch_mm && w.scalar_type() == at::kFloat) {
    if (onednn) {
      static auto lin = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
      torch::jit::Stack stack{x, w, c10::IValue(), c10::IValue(std::string("none")),
                              c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string(""))};
      lin.callBoxed(&stack);
      return stack.back().toTensor();
    }
    return at::mm(x, w.t());
  }
  if (w.scalar_type() == at::kByte) {
    static auto op4 = c10::Dispatcher::singleton()
                          .findSchemaOrThrow("inferctl_cpu::q4_matmul", "")
                          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
    return op4.call(x, w, x.size(1));
  }
  if (s.numel() == 0) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("inferctl_cpu::gemv_f32", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
    return op.call(x, w);
  }
  static auto op8 = c10::Dispatcher::singleton()
                        .findSchemaOrThrow("inferctl_cpu::gemv_int8", "")
                        .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t)>();
  return op8.call(x, w, s, x.size(1));
}

void check_linear(const at::Tensor& w, const at::Tensor& s, int64_t out, int64_t in, const char* name, int64_t layer) {
  TORCH_CHECK(w.device().is_cpu() && w.dim() == 2 && w.is_contiguous() && w.size(0) == out,
              "layer ", layer, " ", name, ": weight must be a contiguous CPU tensor with ", out, " rows");
  if (w.scalar_type() == at::kByte) {
    TORCH_CHECK(w.size(1) == (in + 31) / 32 * 20, "layer ", layer, " ", name, ": Q4_1 blocks must be [", out, ", ",
                (in + 31) / 32 * 20, "] uint8");
  } else if (s.numel() == 0) {
    TORCH_CHECK(w.scalar_type() == at::kFloat && w.size(1) == in, "layer ", layer, " ", name,
                ": float32 weight must be [", out, ", ", in, "]");
  } else {
    TORCH_CHECK(w.scalar_type() == at::kChar && w.size(1) >= in && s.scalar_type() == at::kFloat && s.numel() == out,
                "layer ", layer, " ", name, ": int8 weight must be [", out, ", >=", in, "] with float32 scales [", out,
                "]");
  }
}

// x * cos + partner(x) * sin over one head of D lanes (see the file comment)
inline void rope_head(float* x, const float* c, const float* s, int64_t D, bool half) {
  float tmp[MAX_HEAD_DIM];
  std::memcpy(tmp, x, sizeof(float) * D);
  if (half) {
    const int64_t h = D / 2;
    for (int64_t i = 0; i < D; ++i) x[i] = tmp[i] * c[i] + tmp[i < h ? i + h : i - h] * s[i];
  } else {
    for (int64_t i = 0; i < D; ++i) x[i] = tmp[i] * c[i] + tmp[i ^ 1] * s[i];
  }
}

bool f32cpu(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

// the pool's head_dim, checked (both entry points need it before the core's checks)
int64_t pool_head_dim(const at::Tensor& k_pool, const at::Tensor& v_pool) {
  TORCH_CHECK(f32cpu(k_pool) && f32cpu(v_pool) && k_pool.dim() == 5 && k_pool.sizes() == v_pool.sizes(),
              "k_pool/v_pool must be contiguous float32 CPU tensors [layers, kv_heads, blocks, block_size, head_dim]");
  const int64_t D = k_pool.size(4);
  TORCH_CHECK(D >= 2 && D % 2 == 0 && D <= MAX_HEAD_DIM, "head_dim must be even and <= ", MAX_HEAD_DIM, ", got ", D);
  return D;
}

void greedy_into(const at::Tensor& logits, at::Tensor& out);   // below, beside greedy_logprobs

// the op's result, and with greedy_out given (logits returned: final_norm given) each row's greedy pick written
// into it as greedy_logprobs computes it: the second Python->op call of a greedy decode step moves into this one
at::Tensor with_greedy(at::Tensor logits, const std::optional<at::Tensor>& greedy_out, bool head) {
  if (greedy_out.has_value()) {
    TORCH_CHECK(head, "greedy_out needs the output head (final_norm, out_w): the op must return logits");
    at::Tensor out = *greedy_out;
    TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kDouble && out.is_contiguous() &&
                    out.numel() == 2 * logits.size(0),
                "greedy_out must be a contiguous float64 CPU tensor [2B] = [", 2 * logits.size(0), "]");
    greedy_into(logits.contiguous(), out);
  }
  return logits;
}

// The layers (and the head) over x [B, dim] (owned: updated in place), with row b's RoPE cos/sin [D] at
// crow[b]/srow[b]; every other input is checked here.
at::Tensor run_layers(at::Tensor x, const float* const* crow, const float* const* srow, const at::Tensor& k_pool,
                      const at::Tensor& v_pool, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                      const at::Tensor& seq_lens, at::TensorList attn_norm, at::TensorList ffn_norm,
                      at::TensorList weights, at::TensorList scales, int64_t H, int64_t Hkv, int64_t rope_style,
                      double eps_d, double scale_d, int64_t torch_mm_mask,
                      const std::optional<at::Tensor>& final_norm, const std::optional<at::Tensor>& out_w,
                      const std::optional<at::Tensor>& out_s, bool out_torch_mm) {
  const int64_t B = x.size(0), dim = x.size(1);
  const int64_t L = k_pool.size(0), NB = k_pool.size(2), bs = k_pool.size(3), D = k_pool.size(4);
  TORCH_CHECK(H >= 1 && Hkv >= 1 && H % Hkv == 0 && k_pool.size(1) == Hkv, "n_heads ", H, " / n_kv_heads ", Hkv,
              " do not match the pool's ", k_pool.size(1), " kv heads");
  TORCH_CHECK(rope_style == 0 || rope_style == 1, "rope_style must be 0 (interleaved) or 1 (half)");
  TORCH_CHECK(attn_norm.size() == static_cast<size_t>(L) && ffn_norm.size() == static_cast<size_t>(L) &&
                  weights.size() == static_cast<size_t>(4 * L) && scales.size() == weights.size(),
              "expected ", L, " attn_norm/ffn_norm tensors and ", 4 * L, " weights/scales (pool has ", L, " layers)");
  for (const auto* t : {&slot_mapping, &seq_lens}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == B,
                "slot_mapping and seq_lens must be contiguous int64 [", B, "]");
  }
  TORCH_CHECK(block_tables.device().is_cpu() && block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 &&
                  block_tables.is_contiguous() && block_tables.size(0) == B,
              "block_tables must be contiguous int64 [", B, ", max_blocks]");
  const int64_t maxb = block_tables.size(1), slots = NB * bs;
  const int64_t* slot_p = slot_mapping.data_ptr<int64_t>();
  const int64_t* len_p = seq_lens.data_ptr<int64_t>();
  const int64_t* bt_p = block_tables.data_ptr<int64_t>();
  int64_t max_len = 1;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len_p[b];
    TORCH_CHECK(n >= 1 && n <= maxb * bs, "seq_lens[", b, "] = ", n, " outside 1..", maxb * bs);
    TORCH_CHECK(slot_p[b] >= 0 && slot_p[b] < slots, "slot_mapping[", b, "] = ", slot_p[b], " outside 0..", slots - 1);
    for (int64_t j = 0; j < (n + bs - 1) / bs; ++j) {
      const int64_t blk = bt_p[b * maxb + j];
      TORCH_CHECK(blk >= 0 && blk < NB, "block_tables[", b, ", ", j, "] = ", blk, " outside 0..", NB - 1);
    }
    max_len = std::max(max_len, n);
  }
  const int64_t qkv_out = (H + 2 * Hkv) * D, g = H / Hkv;
  int64_t hidden = -1;
  for (int64_t li = 0; li < L; ++li) {
    TORCH_CHECK(f32cpu(attn_norm[li]) && attn_norm[li].numel() == dim && f32cpu(ffn_norm[li]) &&
                    ffn_norm[li].numel() == dim,
                "layer ", li, ": norm weights must be contiguous float32 [", dim, "]");
    const at::Tensor* w = &weights[4 * li];
    const at::Tensor* s = &scales[4 * li];
    TORCH_CHECK(w[2].dim() == 2 && w[2].size(0) % 2 == 0, "layer ", li, ": w13 must have an even number of rows");
    if (hidden < 0) hidden = w[2].size(0) / 2;
    check_linear(w[0], s[0], qkv_out, dim, "wqkv", li);
    check_linear(w[1], s[1], dim, H * D, "wo", li);
    check_linear(w[2], s[2], 2 * hidden, dim, "w13", li);
    check_linear(w[3], s[3], dim, hidden, "w2", li);
  }

  const bool head = final_norm.has_value() && final_norm->defined();
  at::Tensor head_s = out_s.has_value() && out_s->defined() ? *out_s : at::empty({0}, x.options());
  if (head) {
    TORCH_CHECK(f32cpu(*final_norm) && final_norm->numel() == dim, "final_norm must be contiguous float32 [", dim, "]");
    TORCH_CHECK(out_w.has_value() && out_w->defined() && out_w->dim() == 2, "out_w must be given with final_norm");
    check_linear(*out_w, head_s, out_w->size(0), dim, "output", L);
  }

  const float eps = static_cast<float>(eps_d), scale = static_cast<float>(scale_d);
  const bool half = rope_style == 1;
  at::Tensor h = at::empty({B, dim}, x.options());
  at::Tensor o = at::empty({B, H * D}, x.options());
  at::Tensor act = at::empty({B, hidden}, x.options());
  // blocks past paged_attention.h's stack bounds keep the two-pass loop (a probs row per head)
  const bool tiled = bs <= inferctl_attn::MAX_BLOCK_SIZE && g <= inferctl_attn::MAX_TILE_ROWS;
  at::Tensor probs = at::empty({tiled ? 0 : B * H, max_len}, x.options());
  float* xp = x.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  float* op = o.data_ptr<float>();
  float* ap = act.data_ptr<float>();
  float* pp = probs.data_ptr<float>();
  const int64_t layer_elems = Hkv * slots * D;
  const int64_t grain = std::max<int64_t>(1, ATTN_GRAIN / std::max<int64_t>(1, max_len * D));
  const int64_t kv_grain = std::max<int64_t>(1, ATTN_GRAIN / std::max<int64_t>(1, max_len * D * g));

  for (int64_t li = 0; li < L; ++li) {
    float* kl = k_pool.data_ptr<float>() + li * layer_elems;
    float* vl = v_pool.data_ptr<float>() + li * layer_elems;
    rms_norm_rows(xp, attn_norm[li].data_ptr<float>(), hp, B, dim, eps);
    at::Tensor qkv = gemv(h, weights[4 * li], scales[4 * li], torch_mm_mask & 1, torch_mm_mask & (1 << kOneDnnShift));
    float* qp = qkv.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      float* row = qp + b * qkv_out;
      for (int64_t hh = 0; hh < H + Hkv; ++hh) rope_head(row + hh * D, crow[b], srow[b], D, half);
      for (int64_t kh = 0; kh < Hkv; ++kh) {
        const int64_t dst = (kh * slots + slot_p[b]) * D;
        std::memcpy(kl + dst, row + (H + kh) * D, sizeof(float) * D);
        std::memcpy(vl + dst, row + (H + Hkv + kh) * D, sizeof(float) * D);
      }
    }
    if (tiled) {
      // a decode token is a tile of one token (paged_attention.h): its g query heads share each K/V block read,
      // scores and exp 8 lanes at a time, online softmax -- the prefill op's own code for the same row
      at::parallel_for(0, B * Hkv, kv_grain, [&](int64_t i0, int64_t i1) {
        std::vector<float> acc(g * D);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t b = i / Hkv, kh = i % Hkv;
          inferctl_attn::attend_tile(qp + b * qkv_out + kh * g * D, qkv_out, 1, g, kl + kh * slots * D,
                                     vl + kh * slots * D, bt_p + b * maxb, len_p[b] - 1, bs, D, scale,
                                     op + b * H * D + kh * g * D, H * D, acc.data());
        }
      });
    } else {
      at::parallel_for(0, B * H, grain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t b = i / H, hh = i % H, kh = hh / g, n = len_p[b];
          const float* q = qp + b * qkv_out + hh * D;
          const int64_t* table = bt_p + b * maxb;
          const float* kh_base = kl + kh * slots * D;
          const float* vh_base = vl + kh * slots * D;
          float* p = pp + i * max_len;
          float mx = -INFINITY;
          for (int64_t t = 0; t < n; ++t) {
            const int64_t slot = table[t / bs] * bs + t % bs;
            p[t] = dot(q, kh_base + slot * D, D) * scale;
            mx = std::max(mx, p[t]);
          }
          float sum = 0.f;
          for (int64_t t = 0; t < n; ++t) {
            p[t] = std::exp(p[t] - mx);
            sum += p[t];
          }
          const float inv = 1.f / sum;
          float* out = op + b * H * D + hh * D;
          std::fill(out, out + D, 0.f);
          for (int64_t t = 0; t < n; ++t) {
            const int64_t slot = table[t / bs] * bs + t % bs;
            axpy(p[t] * inv, vh_base + slot * D, out, D);
          }
        }
      });
    }
    at::Tensor y = gemv(o, weights[4 * li + 1], scales[4 * li + 1], torch_mm_mask & 2, torch_mm_mask & (2 << kOneDnnShift));
    const float* yp = y.data_ptr<float>();
    for (int64_t i = 0; i < B * dim; ++i) xp[i] += yp[i];
    rms_norm_rows(xp, ffn_norm[li].data_ptr<float>(), hp, B, dim, eps);
    at::Tensor gu = gemv(h, weights[4 * li + 2], scales[4 * li + 2], torch_mm_mask & 4, torch_mm_mask & (4 << kOneDnnShift));
    const float* gp = gu.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      const float* gr = gp + b * 2 * hidden;
      const float* ur = gr + hidden;
      float* ar = ap + b * hidden;
      for (int64_t j = 0; j < hidden; ++j) ar[j] = gr[j] / (1.f + std::exp(-gr[j])) * ur[j];
    }
    y = gemv(act, weights[4 * li + 3], scales[4 * li + 3], torch_mm_mask & 8, torch_mm_mask & (8 << kOneDnnShift));
    yp = y.data_ptr<float>();
    for (int64_t i = 0; i < B * dim; ++i) xp[i] += yp[i];
  }
  if (head) {
    rms_norm_rows(xp, final_norm->data_ptr<float>(), hp, B, dim, eps);
    return gemv(h, *out_w, head_s, out_torch_mm, torch_mm_mask & kHeadOneDnnBit);
  }
  return x;
}

at::Tensor decode_layers(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_pool,
                         const at::Tensor& v_pool, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& seq_lens, at::TensorList attn_norm, at::TensorList ffn_norm,
                         at::TensorList weights, at::TensorList scales, int64_t H, int64_t Hkv, int64_t rope_style,
                         double eps, double scale, int64_t torch_mm_mask,
                         const std::optional<at::Tensor>& final_norm, const std::optional<at::Tensor>& out_w,
                         const std::optional<at::Tensor>& out_s, bool out_torch_mm,
                         const std::optional<at::Tensor>& greedy_out) {
  TORCH_CHECK(f32cpu(x_in) && x_in.dim() == 2, "x must be a contiguous float32 CPU tensor [B, dim]");
  const int64_t B = x_in.size(0);
  TORCH_CHECK(B >= 1 && B <= MAX_B, "decode_layers takes 1..", MAX_B, " sequences, got ", B);
  const int64_t D = pool_head_dim(k_pool, v_pool);
  TORCH_CHECK(f32cpu(cos) && f32cpu(sin) && cos.numel() == B * D && sin.numel() == B * D,
              "cos/sin must be contiguous float32 [B, head_dim] = [", B, ", ", D, "]");
  const float* crow[MAX_B];
  const float* srow[MAX_B];
  for (int64_t b = 0; b < B; ++b) {
    crow[b] = cos.data_ptr<float>() + b * D;
    srow[b] = sin.data_ptr<float>() + b * D;
  }
  return with_greedy(run_layers(x_in.clone(), crow, srow, k_pool, v_pool, slot_mapping, block_tables, seq_lens,
                                attn_norm, ffn_norm, weights, scales, H, Hkv, rope_style, eps, scale, torch_mm_mask,
                                final_norm, out_w, out_s, out_torch_mm),
                     greedy_out, final_norm.has_value());
}

at::Tensor decode_tokens(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& emb,
                         const std::optional<at::Tensor>& emb_scales, const at::Tensor& cos_table,
                         const at::Tensor& sin_table, const at::Tensor& k_pool, const at::Tensor& v_pool,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                         at::TensorList attn_norm, at::TensorList ffn_norm, at::TensorList weights,
                         at::TensorList scales, int64_t H, int64_t Hkv, int64_t rope_style, double eps, double scale,
                         int64_t torch_mm_mask, const std::optional<at::Tensor>& final_norm,
                         const std::optional<at::Tensor>& out_w, const std::optional<at::Tensor>& out_s,
                         bool out_torch_mm, const std::optional<at::Tensor>& greedy_out) {
  const int64_t B = ids.numel();
  TORCH_CHECK(B >= 1 && B <= MAX_B, "decode_tokens takes 1..", MAX_B, " sequences, got ", B);
  for (const auto* t : {&ids, &positions}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous() &&
                    t->numel() == B,
                "ids and positions must be contiguous int64 [", B, "]");
  }
  const int64_t D = pool_head_dim(k_pool, v_pool);
  TORCH_CHECK(!attn_norm.empty() && attn_norm[0].dim() == 1, "attn_norm must hold a [dim] tensor per layer");
  const int64_t dim = attn_norm[0].numel();
  TORCH_CHECK(f32cpu(cos_table) && f32cpu(sin_table) && cos_table.size(0) == sin_table.size(0) &&
                  cos_table.numel() == cos_table.size(0) * D && sin_table.numel() == cos_table.numel(),
              "cos_table/sin_table must be contiguous float32 [positions, (1,) head_dim = ", D, "]");
  const bool q8 = emb.scalar_type() == at::kChar;
  TORCH_CHECK(emb.device().is_cpu() && emb.dim() == 2 && (emb.scalar_type() == at::kFloat || q8),
              "emb must be a float32 or int8 CPU tensor [vocab, dim]");
  const int64_t vocab = emb.size(0), es0 = emb.stride(0), es1 = emb.stride(1);
  const float* sc = nullptr;
  if (q8) {
    TORCH_CHECK(emb_scales.has_value() && f32cpu(*emb_scales) && emb_scales->numel() == vocab && es1 == 1 &&
                    emb.size(1) >= dim,
                "int8 emb must be [", vocab, ", >=", dim, "] with unit column stride and float32 scales [", vocab,
                "]");
    sc = emb_scales->data_ptr<float>();
  } else {
    TORCH_CHECK(emb.size(1) == dim, "float32 emb must be [vocab, ", dim, "], got [", vocab, ", ", emb.size(1), "]");
  }
  const int64_t* idp = ids.data_ptr<int64_t>();
  const int64_t* pp = positions.data_ptr<int64_t>();
  const int64_t n_pos = cos_table.size(0);
  at::Tensor x = at::empty({B, dim}, cos_table.options());
  float* xp = x.data_ptr<float>();
  const float* crow[MAX_B];
  const float* srow[MAX_B];
  for (int64_t b = 0; b < B; ++b) {
    const int64_t id = idp[b], pos = pp[b];
    TORCH_CHECK_INDEX(id >= 0 && id < vocab, "token id ", id, " outside 0..", vocab - 1);
    TORCH_CHECK_INDEX(pos >= 0 && pos < n_pos, "position ", pos, " outside the RoPE table's 0..", n_pos - 1);
    crow[b] = cos_table.data_ptr<float>() + pos * D;
    srow[b] = sin_table.data_ptr<float>() + pos * D;
    float* xr = xp + b * dim;
    if (q8) {
      // int8 -> float32 is exact, then one float32 product: the value LlamaModel.embed computes
      const int8_t* r = emb.data_ptr<int8_t>() + id * es0;
      const float s = sc[id];
      for (int64_t d = 0; d < dim; ++d) xr[d] = static_cast<float>(r[d]) * s;
    } else {
      const float* r = emb.data_ptr<float>() + id * es0;
      if (es1 == 1) {
        std::memcpy(xr, r, sizeof(float) * dim);
      } else {
        for (int64_t d = 0; d < dim; ++d) xr[d] = r[d * es1];
      }
    }
  }
  return with_greedy(run_layers(x, crow, srow, k_pool, v_pool, slot_mapping, block_tables, seq_lens, attn_norm,
                                ffn_norm, weights, scales, H, Hkv, rope_style, eps, scale, torch_mm_mask, final_norm,
                                out_w, out_s, out_torch_mm),
                     greedy_out, final_norm.has_value());
}

// the first maximal index of r[0..n) as torch.argmax gives it: the first NaN when there is one, else the
// first element equal to the maximum (all -inf: 0). AVX2: one pass for the maximum and NaN test, one for
// the first index equal to it (both 8 lanes at a time); the scalar loop elsewhere.
int64_t first_argmax(const float* r, int64_t n) {
#if INFERCTL_DS_AVX2
  if (n >= 8) {
    __m256 mx = _mm256_loadu_ps(r), un = _mm256_cmp_ps(mx, mx, _CMP_UNORD_Q);
    int64_t i = 8;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(r + i);
      un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      mx = _mm256_max_ps(mx, v);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, mx);
    float m = lanes[0];
    for (int k = 1; k < 8; ++k) m = std::max(m, lanes[k]);
    bool nan = _mm256_movemask_ps(un) != 0;
    for (int64_t j = i; j < n; ++j) {
      nan = nan || std::isnan(r[j]);
      m = std::max(m, r[j]);
    }
    if (!nan) {
      const __m256 mv = _mm256_set1_ps(m);
      int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(r + j), mv, _CMP_EQ_OQ));
        if (mask != 0) return j + __builtin_ctz(static_cast<unsigned>(mask));
      }
      for (; j < n; ++j) {
        if (r[j] == m) return j;
      }
      return 0;   // not reached: the maximum is an element
    }
    // a NaN: the scalar scan below finds the first one
  }
#endif
  int64_t best = 0;
  float m = r[0];
  if (std::isnan(m)) return 0;
  for (int64_t j = 1; j < n; ++j) {
    if (std::isnan(r[j])) return j;   // torch.argmax: a NaN is the maximum, the first one wins
    if (r[j] > m) {                   // strict: the first of equal maxima wins
      m = r[j];
      best = j;
    }
  }
  return best;
}

// each row's (argmax, its log_softmax value) of float32 logits [B, V] (contiguous) into out (float64 [2B])
void greedy_into(const at::Tensor& logits, at::Tensor& out) {
  const int64_t B = logits.size(0), V = logits.size(1);
  const at::Tensor lp = at::_log_softmax(logits, 1, false);   // torch.log_softmax's kernel: its values exactly
  double* o = out.data_ptr<double>();
  const float* xp = logits.data_ptr<float>();
  const float* lpp = lp.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t best = first_argmax(xp + b * V, V);
    o[2 * b] = static_cast<double>(best);
    o[2 * b + 1] = static_cast<double>(lpp[b * V + best]);
  }
}

at::Tensor greedy_logprobs(const at::Tensor& logits_in) {
  TORCH_CHECK(logits_in.device().is_cpu() && logits_in.scalar_type() == at::kFloat && logits_in.dim() == 2 &&
                  logits_in.size(1) >= 1,
              "logits must be a float32 CPU tensor [B, V >= 1]");
  const at::Tensor logits = logits_in.contiguous();
  at::Tensor out = at::empty({2 * logits.size(0)}, logits.options().dtype(at::kDouble));
  greedy_into(logits, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferctl_cpu, m) {
  m.def(
      "decode_layers(Tensor x, Tensor cos, Tensor sin, Tensor k_pool, Tensor v_pool, Tensor slot_mapping, "
      "Tensor block_tables, Tensor seq_lens, Tensor[] attn_norm, Tensor[] ffn_norm, Tensor[] weights, "
      "Tensor[] scales, int n_heads, int n_kv_heads, int rope_style, float eps, float scale, int torch_mm_mask, "
      "Tensor? final_norm=None, Tensor? out_w=None, Tensor? out_s=None, bool out_torch_mm=False, "
      "Tensor(a!)? greedy_out=None) -> Tensor",
      &decode_layers);
  m.def(
      "decode_tokens(Tensor ids, Tensor positions, Tensor emb, Tensor? emb_scales, Tensor cos_table, "
      "Tensor sin_table, Tensor k_pool, Tensor v_pool, Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, "
      "Tensor[] attn_norm, Tensor[] ffn_norm, Tensor[] weights, Tensor[] scales, int n_heads, int n_kv_heads, "
      "int rope_style, float eps, float scale, int torch_mm_mask, Tensor? final_norm=None, Tensor? out_w=None, "
      "Tensor? out_s=None, bool out_torch_mm=False, Tensor(a!)? greedy_out=None) -> Tensor",
      &decode_tokens);
  m.def("greedy_logprobs(Tensor logits) -> Tensor", &greedy_logprobs);
}
