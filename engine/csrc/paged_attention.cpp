// Varlen paged attention for every token of a step (inferctl.engine.attention.paged_attention drives it).
//
// paged_attention(q[T, H, D] (rows of D contiguous, any token stride), k_pool, v_pool [layers, Hkv, NB, bs, D], layer, block_tables[B, maxb],
//                 query_start_loc[B+1], seq_lens[B], scale) -> out[T, H, D]
//
// The step's tokens are packed by sequence: tokens query_start_loc[b] .. query_start_loc[b+1]-1 are the
// new tokens of sequence b, whose context after the step is seq_lens[b] (its cached tokens, e.g. a
// prefix-cache hit or earlier prefill chunks, then the new ones). Token j of sequence b has position
// pos = seq_lens[b] - q_len_b + j and attends causally to keys 0..pos of its sequence, read IN PLACE from
// the pool through block_tables[b] (no gather): decode tokens (q_len 1), prefill chunks and speculative
// verification rows alike. The step's new K/V must already be in the pool (KVCache.write). GQA: query
// head h reads kv head h / (H / Hkv). Math: csrc/paged_attention.h (online softmax, FlashAttention's
// recurrence), float32 throughout; the result equals softmax(q K^T * scale) V up to summation order.
// Threads: at::parallel_for over (tile, kv head) only, a tile being up to PA_TILE_TOKENS consecutive tokens of
// one sequence that share each K/V block read (attend_tile; a decode token is a tile of one). Every input is
// checked with TORCH_CHECK (a RuntimeError naming the field, never a crash), block ids against the pool too.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "paged_attention.h"

namespace {

constexpr int64_t PA_GRAIN = 1 << 14;   // score multiply-adds per parallel chunk: less stays on one thread
constexpr int64_t PA_TILE_TOKENS = 8;   // query tokens of a chunk sharing each K/V block read (attend_tile)

at::Tensor paged_attention_op(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool, int64_t layer,
                              const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                              const at::Tensor& seq_lens, double scale_d) {
  using namespace inferctl_attn;
  auto f32cpu = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
  };
  auto i64cpu = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous();
  };
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kFloat && q.dim() == 3 && q.stride(2) == 1 &&
                  q.stride(1) == q.size(2) && q.stride(0) >= q.size(1) * q.size(2),
              "q must be a float32 CPU tensor [T, n_heads, head_dim] with contiguous rows (any token stride)");
  TORCH_CHECK(f32cpu(k_pool) && f32cpu(v_pool) && k_pool.dim() == 5 && k_pool.sizes() == v_pool.sizes(),
              "k_pool/v_pool must be contiguous float32 CPU tensors [layers, kv_heads, blocks, block_size, head_dim]");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t L = k_pool.size(0), Hkv = k_pool.size(1), NB = k_pool.size(2), bs = k_pool.size(3);
  TORCH_CHECK(T >= 1, "q must hold at least one token");
  TORCH_CHECK(layer >= 0 && layer < L, "layer ", layer, " outside 0..", L - 1);
  TORCH_CHECK(k_pool.size(4) == D && D >= 1 && D <= MAX_HEAD_DIM, "head_dim ", D, " must match the pool's ",
              k_pool.size(4), " and be <= ", MAX_HEAD_DIM);
  TORCH_CHECK(Hkv >= 1 && H % Hkv == 0 && H / Hkv <= MAX_GROUP, "n_heads ", H, " must be a multiple of the pool's ",
              Hkv, " kv heads (at most ", MAX_GROUP, " per kv head)");
  TORCH_CHECK(bs <= MAX_BLOCK_SIZE, "block_size ", bs, " > ", MAX_BLOCK_SIZE);
  TORCH_CHECK(i64cpu(block_tables) && block_tables.dim() == 2, "block_tables must be contiguous int64 [B, max_blocks]");
  const int64_t B = block_tables.size(0), maxb = block_tables.size(1);
  TORCH_CHECK(B >= 1, "block_tables must hold at least one sequence");
  TORCH_CHECK(i64cpu(query_start_loc) && query_start_loc.numel() == B + 1, "query_start_loc must be contiguous int64 [",
              B + 1, "]");
  TORCH_CHECK(i64cpu(seq_lens) && seq_lens.numel() == B, "seq_lens must be contiguous int64 [", B, "]");
  const int64_t* qsl = query_start_loc.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  TORCH_CHECK(qsl[0] == 0 && qsl[B] == T, "query_start_loc must run from 0 to T = ", T, ", got ", qsl[0], "..",
              qsl[B]);
  // tiles: up to PA_TILE_TOKENS consecutive tokens of one sequence (a decode token is a tile of one)
  const int64_t g = H / Hkv;
  const int64_t tile_max = std::max<int64_t>(1, std::min<int64_t>(PA_TILE_TOKENS, MAX_TILE_ROWS / g));
  std::vector<int64_t> tile_tok, tile_seq;   // first token, sequence (a tile ends at the next one's start or T)
  int64_t total_keys = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = qsl[b + 1] - qsl[b], n = lens[b];
    TORCH_CHECK(q_len >= 1, "query_start_loc must increase: sequence ", b, " has ", q_len, " tokens");
    TORCH_CHECK(n >= q_len && n <= maxb * bs, "seq_lens[", b, "] = ", n, " outside ", q_len, "..", maxb * bs);
    for (int64_t j = 0; j < (n + bs - 1) / bs; ++j) {
      const int64_t blk = bt[b * maxb + j];
      TORCH_CHECK(blk >= 0 && blk < NB, "block_tables[", b, ", ", j, "] = ", blk, " outside 0..", NB - 1);
    }
    for (int64_t t = qsl[b]; t < qsl[b + 1]; t += tile_max) {
      tile_tok.push_back(t);
      tile_seq.push_back(b);
    }
    total_keys += q_len * (2 * n - q_len + 1) / 2;   // sum of pos + 1 over the sequence's tokens
  }
  const int64_t ntiles = static_cast<int64_t>(tile_tok.size());
  tile_tok.push_back(T);

  at::Tensor out = at::empty({T, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const int64_t q_tok = q.stride(0);
  float* op = out.data_ptr<float>();
  const int64_t head_elems = NB * bs * D;
  const float* kl = k_pool.data_ptr<float>() + layer * Hkv * head_elems;
  const float* vl = v_pool.data_ptr<float>() + layer * Hkv * head_elems;
  const float scale = static_cast<float>(scale_d);
  const int64_t per_item = std::max<int64_t>(1, total_keys / ntiles * g * D);
  const int64_t grain = std::max<int64_t>(1, PA_GRAIN / per_item);
  at::parallel_for(0, ntiles * Hkv, grain, [&](int64_t i0, int64_t i1) {
    std::vector<float> acc(tile_max * g * D);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t ti = i / Hkv, kh = i % Hkv, b = tile_seq[ti];
      const int64_t t0 = tile_tok[ti];
      const int64_t nq = std::min(tile_tok[ti + 1], qsl[b + 1]) - t0;
      const int64_t head = kh * g * D;
      const int64_t pos0 = lens[b] - (qsl[b + 1] - t0);
      attend_tile(qp + t0 * q_tok + head, q_tok, nq, g, kl + kh * head_elems, vl + kh * head_elems, bt + b * maxb,
                  pos0, bs, D, scale, op + t0 * H * D + head, H * D, acc.data());
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferctl_cpu, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_pool, Tensor v_pool, int layer, Tensor block_tables, "
      "Tensor query_start_loc, Tensor seq_lens, float scale) -> Tensor",
      &paged_attention_op);
}
