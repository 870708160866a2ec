"""Paged attention: the per-step metadata, the KV cache pool, and attention over block tables.

Vocabulary follows vLLM (``block_table``, ``slot_mapping``, ``query_start_loc``, ``seq_lens``):
every sequence's keys/values live in fixed-size blocks of one pool; a block table lists the
physical blocks of a sequence in order, and the flat slot of context position ``p`` is
``block_table[p // block_size] * block_size + p % block_size``.

Three implementations of the same contract:

* the C++ op ``torch.ops.inferctl_cpu.paged_attention`` (``csrc/paged_attention.cpp``; CPU,
  float32 pool, the engine's CPU kernels on: :func:`kernel_eligible`): every token of the step
  (decodes, prefill chunks after a cached prefix, speculative verification rows) in one call per
  layer, each query attending causally to keys ``0 … pos`` of its sequence read in place through
  the block table with FlashAttention's online softmax (Dao et al. 2022), parallel over
  (tile, kv head) with ``at::parallel_for``, a tile being up to 8 consecutive tokens of one
  sequence whose query rows share each K/V block read (a decode token is a tile of one); it reads
  only the contract fields, so a step it serves builds none of the gather-path fields below;
* ``impl="matmul"`` (the CPU default without the op): decode sequences (one new token each)
  are attended in one batched matmul/softmax/matmul over their gathered context (GQA without
  repeating K/V);
  prefill chunks use ``scaled_dot_product_attention`` one chunk at a time (a loop over
  sequences, never over tokens).
* ``impl="sdpa"`` (the CUDA default): everything through
  ``torch.nn.functional.scaled_dot_product_attention`` with a boolean mask. Runs on CPU too,
  so it is tested here.

All read the step's new K/V from the pool (the model writes them at ``slot_mapping`` first)
with every sequence's context (cached + new), through its block table, so the result is causal
within the chunk and full over the cached context.

Reading blocks in place on the plain path. The pool is laid out head-major, ``[layers,
kv_heads, blocks, block_size, head_dim]``, so a run of consecutive blocks of one head is one contiguous
``[L, head_dim]`` matrix: a sequence whose block table is a consecutive range (a lone request,
the common batch-1 case) is attended straight from the pool through a view, with no copy. Other
tables are gathered a whole block at a time (``index_select`` over the block dimension: one
``block_size·head_dim`` memcpy per block and head, instead of one indexed row copy per token and
head), directly into the ``[kv_heads, B, L, head_dim]`` layout the batched matmuls read, so
the attention matmuls never copy again. (Before: an ``index_select`` of every cached row, head by
head, into a contiguous buffer: half of attention's time at batch 32, docs/performance.md.)
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from inferctl.engine.quant import dequantize_kv, quantize_kv

Chunk = tuple[Sequence[int], int, int, bool]
"""(block_table, num_cached_tokens, num_new_tokens, all_logits) of one sequence in a step."""


@dataclass
class PrefillChunk:
    """A sequence with more than one new token in this step (precomputed once per step).

    ``token_start``/``token_end`` index the packed token batch; ``seq_len`` = L, the whole
    context (cached + new); ``blocks`` LongTensor[ceil(L / block_size)] its physical blocks;
    ``first_block`` the first of them when they are consecutive (read in place), else None;
    ``mask`` [q_len, L] bool, True = may attend (``None`` when the chunk is the whole,
    plain-causal context).
    """

    token_start: int
    token_end: int
    seq_len: int
    blocks: torch.Tensor
    first_block: int | None
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    """Everything attention needs about one step's packed batch of ``B`` sequences, ``T`` tokens.

    Contract fields (docs/architecture.md):
      slot_mapping    LongTensor[T]   flat KV slot of each input token
      query_start_loc LongTensor[B+1] cumulative new-token counts
      seq_lens        LongTensor[B]   context length after this step (cached + new)
      block_tables    LongTensor[B, max_blocks] physical block ids, padded with 0
      logits_indices  LongTensor[N]   rows of the packed batch whose logits are returned

    Step scalars (set by :meth:`build`, or by :meth:`prepare` from the contract fields when the
    metadata was constructed by hand; no tensors):
      num_decodes      int Bd: single-token (decode) sequences
      all_decode       bool: every sequence is a decode, in packed order
      max_context      int: the longest context (cached + new) in the step; every position
                       is below it (the model sizes its RoPE table by it)

    Gather-path fields, made only when the plain PyTorch path runs (:meth:`prepare_plain`; the
    C++ op reads the contract fields alone, so a step it serves builds none of them):
      decode_token_idx LongTensor[Bd]  packed index of each decode sequence (None when
                       ``all_decode``: the packed batch is the decode batch)
      decode_num_blocks int nb: Ld = nb · block_size context positions per decode sequence
      decode_blocks    LongTensor[Bd, nb] those sequences' blocks (padded with block 0); None
                       when ``decode_first_block`` is set (the blocks are that range)
      decode_first_block int | None: with one decode sequence whose blocks are consecutive,
                       the first (its context is read in place, see the module doc)
      decode_len       int | None: with one decode sequence (Bd = 1), its context length; the
                       positions past it are masked on the scores in place, so no mask tensor
                       is built (the per-step op count matters at batch 1, docs/performance.md)
      decode_bias      FloatTensor[Bd, Ld] 0 where valid, -inf past the sequence's length
                       (Bd > 1 only)
      decode_valid     BoolTensor[Bd, Ld] (Bd > 1 only)
      prefills         list[PrefillChunk] the multi-token chunks
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    logits_indices: torch.Tensor
    block_size: int = 0
    num_decodes: int = 0
    decode_token_idx: torch.Tensor | None = None
    decode_num_blocks: int = 0
    decode_blocks: torch.Tensor | None = None
    decode_first_block: int | None = None
    decode_len: int | None = None
    decode_bias: torch.Tensor | None = None
    decode_valid: torch.Tensor | None = None
    prefills: list[PrefillChunk] = field(default_factory=list)
    all_decode: bool = False
    max_context: int = 0
    _prepared: bool = False
    _plain_ready: bool = False
    #: host copies the scalars and the gather-path fields come from: (query_start_loc, seq_lens,
    #: a flat list holding block_tables row-major from ``offset``, offset, max_blocks)
    _host: tuple | None = field(default=None, repr=False, compare=False)
    #: (CPU, set by :meth:`build`) the numpy view of the one buffer the five contract fields view, and
    #: their sizes (T, B, N, max_blocks): what ``build(..., reuse=)`` overwrites in place
    _np: Any = field(default=None, repr=False, compare=False)
    _sizes: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        """T: tokens in the packed batch."""
        return int(self.slot_mapping.shape[0])

    @property
    def num_seqs(self) -> int:
        """B: sequences in the step."""
        return int(self.seq_lens.shape[0])

    @classmethod
    def build(cls, chunks: Sequence[Chunk], block_size: int,
              device: torch.device | str = "cpu", reuse: "AttentionMetadata | None" = None) -> "AttentionMetadata":
        """Build the metadata of one step from each sequence's chunk.

        ``chunks``: ``(block_table, num_cached_tokens, num_new_tokens, all_logits)`` per
        sequence, in packed order. ``logits_indices`` is the last new token of each chunk, or
        every new token of chunks with ``all_logits``. The five contract fields are views of one
        int64 tensor made in one conversion (on CPU through ``array``/``torch.frombuffer``, ~3x
        cheaper than ``torch.tensor`` of a list); the gather-path fields wait for
        :meth:`prepare_plain`.

        ``reuse`` (CPU; the runner passes the previous step's metadata): when it was built here for
        the same five field sizes (T, B+1, B, N, B·max_blocks: e.g. a decode step of the same batch
        within the same block count) and its gather-path fields were never made, its buffer is
        overwritten in place with this step's values and it is returned (the same numbers as a fresh
        build, without the tensor, the split and the object: ~8 µs of a ~300 µs batch-1 step,
        docs/performance.md). The previous step's tensors then hold this step's values: only a
        caller that is done with them may pass them.

        Raises ValueError when ``block_size`` < 1, a chunk has no new tokens or a negative
        cached count, or a block table is too short for ``cached + new`` tokens.
        """
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if len(chunks) == 0:
            raise ValueError("chunks must hold at least one sequence")
        bs = block_size
        slot_mapping: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        logits_idx: list[int] = []
        needs: list[int] = []
        start = num_dec = 0
        for i, (table, cached, new, all_logits) in enumerate(chunks):
            if new < 1 or cached < 0:
                raise ValueError(f"chunk {i}: num_new_tokens must be >= 1 and num_cached_tokens >= 0, "
                                 f"got new={new} cached={cached}")
            total = cached + new
            need = (total + bs - 1) // bs
            if len(table) < need:
                raise ValueError(f"chunk {i}: block_table has {len(table)} blocks, "
                                 f"{total} tokens need {need} (block_size {bs})")
            if new == 1:
                slot_mapping.append(table[cached // bs] * bs + cached % bs)
                logits_idx.append(start)
                num_dec += 1
            else:
                slot_mapping.extend(table[p // bs] * bs + p % bs for p in range(cached, total))
                if all_logits:
                    logits_idx.extend(range(start, start + new))
                else:
                    logits_idx.append(start + new - 1)
            start += new
            qsl.append(start)
            seq_lens.append(total)
            needs.append(need)
        B = len(seq_lens)
        max_blocks = max(needs)
        flat = slot_mapping + qsl + seq_lens + logits_idx
        d = len(flat)
        for (table, _, _, _), need in zip(chunks, needs):
            flat.extend(table[:need])
            if need < max_blocks:
                flat.extend([0] * (max_blocks - need))
        nl = len(logits_idx)
        if (reuse is not None and reuse._np is not None and not reuse._plain_ready and reuse.block_size == bs
                and reuse._sizes == (start, B, nl, max_blocks)):
            reuse._np[:] = flat
            reuse.num_decodes = num_dec
            reuse.all_decode = num_dec == B
            reuse.max_context = max(seq_lens)
            reuse._host = (qsl, seq_lens, flat, d, max_blocks)
            return reuse
        dev = torch.device(device)
        if dev.type == "cpu":
            buf = torch.frombuffer(array("q", flat), dtype=torch.long)   # keeps the array alive
        else:
            buf = torch.tensor(flat, dtype=torch.long, device=dev)
        # one split (one op) for the five views: a slice each cost as much again
        # (the Tensor method: ~2 µs less than torch.split_with_sizes' Python-level dispatch)
        sm, qs, sl, li, bt = buf.split_with_sizes((start, B + 1, B, nl, B * max_blocks))
        meta = cls(slot_mapping=sm, query_start_loc=qs, seq_lens=sl, logits_indices=li,
                   block_tables=bt.view(B, max_blocks), block_size=bs, num_decodes=num_dec,
                   all_decode=num_dec == B, max_context=max(seq_lens), _prepared=True,
                   _host=(qsl, seq_lens, flat, d, max_blocks))
        if dev.type == "cpu":
            meta._np, meta._sizes = buf.numpy(), (start, B, nl, max_blocks)
        return meta

    def prepare(self, block_size: int) -> None:
        """Set the step scalars from the contract fields (one host sync) when :meth:`build` did
        not; idempotent. Raises ValueError when the metadata was built for another block size."""
        if self.block_size and self.block_size != block_size:
            raise ValueError(f"metadata built for block_size {self.block_size}, cache has {block_size}")
        if self._prepared:
            return
        qsl = self.query_start_loc.tolist()
        seq_lens = self.seq_lens.tolist()
        self.block_size = block_size
        self.num_decodes = sum(1 for b in range(len(seq_lens)) if qsl[b + 1] - qsl[b] == 1)
        self.all_decode = self.num_decodes == len(seq_lens)
        self.max_context = max(seq_lens)
        self._host = (qsl, seq_lens, self.block_tables.reshape(-1).tolist(), 0, int(self.block_tables.shape[1]))
        self._prepared = True

    def prepare_plain(self, block_size: int) -> None:
        """:meth:`prepare`, then the gather-path fields the plain PyTorch attention reads
        (decode batch, masks, prefill chunks); idempotent. Raises ValueError as :meth:`prepare`."""
        self.prepare(block_size)
        if self._plain_ready:
            return
        qsl, seq_lens, flat, off, mb = self._host
        tables = [flat[off + i * mb: off + i * mb + (sl + block_size - 1) // block_size]
                  for i, sl in enumerate(seq_lens)]
        self._derive(qsl, seq_lens, tables, block_size, self.slot_mapping.device)

    def _derive(self, qsl: list[int], seq_lens: list[int], tables: list[list[int]],
                block_size: int, dev: torch.device) -> None:
        dec_tok: list[int] = []
        dec_tables: list[list[int]] = []
        dec_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        for b, sl in enumerate(seq_lens):
            q_len = qsl[b + 1] - qsl[b]
            table = tables[b]
            if q_len == 1:
                dec_tok.append(qsl[b])
                dec_tables.append(table)
                dec_lens.append(sl)
            else:
                cached = sl - q_len
                if cached == 0:
                    mask = None
                else:
                    qpos = torch.arange(cached, sl, device=dev)[:, None]
                    mask = torch.arange(sl, device=dev)[None, :] <= qpos
                prefills.append(PrefillChunk(qsl[b], qsl[b + 1], sl, torch.tensor(table, dtype=torch.long, device=dev),
                                             _first_if_consecutive(table), mask))
        self.prefills = prefills
        if dec_tok:
            nb = max(len(t) for t in dec_tables)
            self.decode_num_blocks = nb
            if prefills:
                self.decode_token_idx = torch.tensor(dec_tok, dtype=torch.long, device=dev)
            if len(dec_tables) == 1:    # batch 1: no mask tensors, blocks read in place when consecutive
                self.decode_len = dec_lens[0]
                self.decode_first_block = _first_if_consecutive(dec_tables[0])
                if self.decode_first_block is None:
                    self.decode_blocks = torch.tensor(dec_tables[0], dtype=torch.long, device=dev)[None, :]
            else:
                self.decode_blocks = torch.tensor([t + [0] * (nb - len(t)) for t in dec_tables], dtype=torch.long,
                                                  device=dev)
                lens = torch.tensor(dec_lens, dtype=torch.long, device=dev)
                self.decode_valid = torch.arange(nb * block_size, device=dev)[None, :] < lens[:, None]
                self.decode_bias = torch.zeros(self.decode_valid.shape, dtype=torch.float32, device=dev)
                self.decode_bias.masked_fill_(~self.decode_valid, float("-inf"))
        self._plain_ready = True


def _first_if_consecutive(table: list[int]) -> int | None:
    """``table[0]`` when the blocks are ``table[0], table[0] + 1, …`` (readable in place), else None."""
    if not table:
        return None
    first = table[0]
    return first if all(b == first + i for i, b in enumerate(table)) else None


@dataclass
class KVCache:
    """The paged KV pool for all layers, allocated once.

    k, v: [n_layers, n_kv_heads, num_blocks, block_size, head_dim] in the model dtype (head-major:
    consecutive blocks of one head are one contiguous matrix, see the module doc), or int8 with
    ``k_scale``/``v_scale`` float32 [n_layers, n_kv_heads, num_blocks, block_size]
    (per-token-per-head absmax scales, see ``engine.quant.quantize_kv``). The flat slot of a
    token is ``block · block_size + offset``, the same for every head.
    """

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    #: per layer: (k, v) [Hkv, num_blocks, bs, D], their [Hkv, slots, D] and [Hkv, num_blocks, bs·D]
    #: views, made once (indexing the pool anew costs ops every layer of every step)
    _views: list[tuple[torch.Tensor, ...]] = field(default_factory=list, init=False, repr=False, compare=False)

    def layer_views(self, layer: int) -> tuple[torch.Tensor, ...]:
        """``(k, v, k_slots, v_slots, k_rows, v_rows)`` of ``layer``: views of the pool (see ``_views``)."""
        if not self._views:
            Hkv, bs, D = self.k.shape[1], self.k.shape[3], self.k.shape[4]
            with torch.inference_mode(False):   # plain views: writable in and out of inference mode
                self._views = [(k, v, k.view(Hkv, -1, D), v.view(Hkv, -1, D), k.view(Hkv, -1, bs * D),
                                v.view(Hkv, -1, bs * D)) for k, v in zip(self.k.unbind(0), self.v.unbind(0))]
        return self._views[layer]

    @property
    def kv_int8(self) -> bool:
        return self.k_scale is not None

    @property
    def n_layers(self) -> int:
        return int(self.k.shape[0])

    @property
    def n_kv_heads(self) -> int:
        return int(self.k.shape[1])

    @property
    def num_blocks(self) -> int:
        return int(self.k.shape[2])

    @property
    def block_size(self) -> int:
        return int(self.k.shape[3])

    @property
    def dtype_name(self) -> str:
        """"int8", "fp32", "bf16" or "fp16" — for /stats ``kv_cache_dtype``."""
        if self.kv_int8:
            return "int8"
        return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
            self.k.dtype, str(self.k.dtype))

    @staticmethod
    def bytes_per_block(n_layers: int, block_size: int, n_kv_heads: int, head_dim: int,
                        dtype: torch.dtype, kv_int8: bool = False) -> int:
        """Bytes of one block across all layers, K and V: 2·L·bs·Hkv·D·elem (+ 2·L·bs·Hkv·4 for int8 scales)."""
        elems = n_layers * block_size * n_kv_heads * head_dim
        if kv_int8:
            return 2 * elems + 2 * n_layers * block_size * n_kv_heads * 4
        return 2 * elems * torch.empty((), dtype=dtype).element_size()

    @classmethod
    def allocate(cls, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 kv_int8: bool = False) -> "KVCache":
        """Allocate a zeroed pool. Raises ValueError on non-positive sizes (naming the field);
        torch.OutOfMemoryError propagates from the allocator."""
        for name, val in (("n_layers", n_layers), ("num_blocks", num_blocks), ("block_size", block_size),
                          ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            if int(val) < 1:
                raise ValueError(f"KVCache.allocate: {name} must be >= 1, got {val}")
        shape = (n_layers, n_kv_heads, num_blocks, block_size, head_dim)
        if kv_int8:
            sshape = shape[:-1]
            return cls(k=torch.zeros(shape, dtype=torch.int8, device=device),
                       v=torch.zeros(shape, dtype=torch.int8, device=device),
                       k_scale=torch.zeros(sshape, dtype=torch.float32, device=device),
                       v_scale=torch.zeros(sshape, dtype=torch.float32, device=device))
        return cls(k=torch.zeros(shape, dtype=dtype, device=device),
                   v=torch.zeros(shape, dtype=dtype, device=device))

    def nbytes(self) -> int:
        """Bytes held by the pool (K, V and scales)."""
        n = self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()
        if self.k_scale is not None and self.v_scale is not None:
            n += (self.k_scale.numel() + self.v_scale.numel()) * 4
        return n

    # ---- per-layer access -------------------------------------------------------------
    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, n_kv_heads, head_dim] at the flat slots ``slot_mapping`` [T]."""
        Hkv = self.k.shape[1]
        _, _, kl, vl, _, _ = self.layer_views(layer)
        if not self.kv_int8 and k.dtype == kl.dtype:     # the common case, in as few ops as possible
            kl.index_copy_(1, slot_mapping, k.transpose(0, 1))
            vl.index_copy_(1, slot_mapping, v.transpose(0, 1))
            return
        if self.kv_int8:
            kq, ks = quantize_kv(k)
            vq, vs = quantize_kv(v)
            kl.index_copy_(1, slot_mapping, kq.transpose(0, 1))
            vl.index_copy_(1, slot_mapping, vq.transpose(0, 1))
            self.k_scale[layer].view(Hkv, -1).index_copy_(1, slot_mapping, ks.t())
            self.v_scale[layer].view(Hkv, -1).index_copy_(1, slot_mapping, vs.t())
        else:
            kl.index_copy_(1, slot_mapping, k.transpose(0, 1).to(kl.dtype))
            vl.index_copy_(1, slot_mapping, v.transpose(0, 1).to(vl.dtype))

    def read_blocks(self, layer: int, blocks: torch.Tensor | None, first_block: int | None,
                    dtype: torch.dtype, num_blocks: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of ``blocks`` [n] (in order) → [n_kv_heads, n·block_size, head_dim] in ``dtype``.

        ``first_block`` not None (the blocks are ``first_block … first_block + n - 1``): views
        of the pool, no copy (full-precision pool in ``dtype``); ``blocks`` may then be None
        with ``num_blocks`` = n. Otherwise one block-granular ``index_select``. int8 pools are
        dequantized (a new tensor either way).
        """
        n = int(blocks.shape[0]) if blocks is not None else int(num_blocks)
        Hkv, bs, D = self.k.shape[1], self.k.shape[3], self.k.shape[4]
        kl, vl, _, _, k_rows, v_rows = self.layer_views(layer)
        if first_block is not None:
            k = kl[:, first_block:first_block + n]
            v = vl[:, first_block:first_block + n]
        else:   # over [Hkv, blocks, bs·D] rows: 2-3x faster than over [Hkv, blocks, bs, D] (measured, CPU)
            k = k_rows.index_select(1, blocks).view(Hkv, n, bs, D)
            v = v_rows.index_select(1, blocks).view(Hkv, n, bs, D)
        if self.kv_int8:
            if first_block is not None:
                ks = self.k_scale[layer, :, first_block:first_block + n]
                vs = self.v_scale[layer, :, first_block:first_block + n]
            else:
                ks = self.k_scale[layer].index_select(1, blocks)
                vs = self.v_scale[layer].index_select(1, blocks)
            k, v = dequantize_kv(k, ks, dtype), dequantize_kv(v, vs, dtype)
        elif k.dtype != dtype:
            k, v = k.to(dtype), v.to(dtype)
        return k.reshape(Hkv, n * bs, D), v.reshape(Hkv, n * bs, D)


#: csrc/paged_attention.h's stack bounds (``MAX_BLOCK_SIZE``, ``MAX_GROUP`` query heads per KV head,
#: ``MAX_HEAD_DIM``): the op refuses a pool past them, so such a cache keeps the plain path.
KERNEL_MAX_BLOCK_SIZE, KERNEL_MAX_GROUP, KERNEL_MAX_HEAD_DIM = 256, 64, 512


def kernel_eligible(ops: Any | None, q: torch.Tensor, kv_cache: KVCache) -> bool:
    """The one predicate for the C++ op (``csrc/paged_attention.cpp``): the engine's CPU kernels
    loaded (``ops`` not None: ``cpu_kernels.ops_for`` said CPU, float32, ``INFERCTL_CPU_KERNELS`` on,
    built) and exporting ``paged_attention``; q float32 on CPU with contiguous ``[H, D]`` rows; a
    contiguous float32 pool (int8 KV, CUDA and bf16 keep the plain path) within the op's bounds
    (:data:`KERNEL_MAX_BLOCK_SIZE`, :data:`KERNEL_MAX_GROUP`, :data:`KERNEL_MAX_HEAD_DIM`)."""
    return (ops is not None and q.dtype == torch.float32 and q.device.type == "cpu" and not kv_cache.kv_int8
            and kv_cache.k.dtype == torch.float32 and q.stride(2) == 1 and q.stride(1) == q.shape[2]
            and kv_cache.k.is_contiguous() and kv_cache.v.is_contiguous() and hasattr(ops, "paged_attention")
            and kv_cache.block_size <= KERNEL_MAX_BLOCK_SIZE and q.shape[2] <= KERNEL_MAX_HEAD_DIM
            and q.shape[1] <= KERNEL_MAX_GROUP * kv_cache.k.shape[1])


def paged_attention(q: torch.Tensor, kv_cache: KVCache, layer: int, meta: AttentionMetadata,
                    scale: float, impl: str = "matmul", ops: Any | None = None) -> torch.Tensor:
    """Attention of the step's queries over each sequence's paged context.

    q: [T, n_heads, head_dim] (RoPE applied). The step's new K/V must already be written to
    ``kv_cache`` (see :meth:`KVCache.write`). Returns [T, n_heads, head_dim] in q's dtype.
    ``ops``: the engine's CPU kernels (``cpu_kernels.ops_for``; the model passes its
    ``kernel_ops``): when :func:`kernel_eligible`, every token of the step (decodes, prefill
    chunks, verification rows) goes through one C++ call that reads K/V in place through the
    block tables (online softmax, fp32; equal to this path up to summation order,
    tests/unit/test_paged_attention_op.py), and ``impl`` is not used. Otherwise ``impl``:
    "matmul" (batched decode via matmul; CPU default) or "sdpa". Raises ValueError on an unknown
    impl; RuntimeError from the op on inconsistent metadata.
    """
    if impl not in ("matmul", "sdpa"):
        raise ValueError(f"attention impl must be 'matmul' or 'sdpa', got {impl!r}")
    if kernel_eligible(ops, q, kv_cache):
        meta.prepare(kv_cache.block_size)
        return ops.paged_attention(q, kv_cache.k, kv_cache.v, layer, meta.block_tables.contiguous(),
                                   meta.query_start_loc.contiguous(), meta.seq_lens.contiguous(), scale)
    meta.prepare_plain(kv_cache.block_size)
    T, H, D = q.shape
    Hkv = kv_cache.n_kv_heads
    g = H // Hkv
    dec_out = None
    Bd = meta.num_decodes
    if Bd:
        qd = q if meta.all_decode else q.index_select(0, meta.decode_token_idx)
        blocks = meta.decode_blocks
        k, v = kv_cache.read_blocks(layer, None if blocks is None else blocks.view(-1), meta.decode_first_block,
                                    q.dtype, meta.decode_num_blocks)
        L = k.shape[1] // Bd
        k = k.view(Hkv, Bd, L, D)        # [Hkv, Bd, L, D]: a view of the gathered (or pooled) blocks
        v = v.view(Hkv, Bd, L, D)
        n = meta.decode_len              # batch 1: its context length; no mask tensor
        if impl == "matmul":
            # bmm over [Hkv·Bd] (what matmul does with these 4-D shapes, without its reshapes)
            qh = qd.view(Bd, Hkv, g, D).transpose(0, 1).reshape(Hkv * Bd, g, D)
            kb, vb = k.reshape(Hkv * Bd, L, D), v.reshape(Hkv * Bd, L, D)   # views (Bd = 1 or gathered)
            scores = torch.bmm(qh, kb.transpose(1, 2))                      # [Hkv·Bd, g, L]
            if n is None:
                scores = (scores.float() * scale).view(Hkv, Bd, g, L) + meta.decode_bias[None, :, None, :]
            else:
                # the same numbers as adding the 0/-inf bias (x + 0 is x; x + -inf is -inf)
                scores = scores.float().mul_(scale)
                scores[..., n:] = float("-inf")
            p = torch.softmax(scores, dim=-1).to(v.dtype).view(Hkv * Bd, g, L)
            dec_out = torch.bmm(p, vb).view(Hkv, Bd, g, D).transpose(0, 1).reshape(Bd, H, D)
        else:
            mask = meta.decode_valid[:, None, None, :] if n is None else None
            if n is not None:
                k, v = k[:, :, :n], v[:, :, :n]
            o = F.scaled_dot_product_attention(qd.view(Bd, H, 1, D), k.transpose(0, 1), v.transpose(0, 1),
                                               attn_mask=mask, scale=scale, enable_gqa=g > 1)
            dec_out = o.reshape(Bd, H, D)
        if meta.all_decode:
            return dec_out
    out = torch.empty_like(q)
    if dec_out is not None:
        out.index_copy_(0, meta.decode_token_idx, dec_out)
    for pc in meta.prefills:
        qc = q[pc.token_start:pc.token_end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        k, v = kv_cache.read_blocks(layer, pc.blocks, pc.first_block, q.dtype)
        kc = k[:, :pc.seq_len].unsqueeze(0)                                # [1, Hkv, L, D]
        vc = v[:, :pc.seq_len].unsqueeze(0)
        if pc.mask is None:
            o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, scale=scale, enable_gqa=g > 1)
        else:
            o = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=pc.mask, scale=scale, enable_gqa=g > 1)
        out[pc.token_start:pc.token_end] = o[0].transpose(0, 1)
    return out
