"""Device memory accounting, OOM messages and error classification.

:class:`MemoryAccountant` accounts every byte the engine puts on the device (weights, the KV
pool, each step's activations) against a budget. On CPU it simulates PyTorch's CUDA caching
allocator (``c10/cuda/CUDACachingAllocator.cpp``): memory is *reserved* in segments and
*allocated* in blocks carved out of them; a freed block stays reserved (cached) until
``empty_cache()`` releases its segment, and only a segment with no live block can be released.
Reserved-but-unallocated memory is therefore the allocator's fragmentation. When a request
does not fit, the allocator first releases every fully free cached segment (as PyTorch does)
and then raises a real ``torch.OutOfMemoryError`` whose message has PyTorch's current format.
On CUDA the accountant reads the real numbers (``torch.cuda.mem_get_info``,
``memory_allocated``, ``memory_reserved``) and makes real allocations.

Pure helpers: :func:`format_oom_message` (PyTorch's new format) and
:func:`format_oom_message_old` (PyTorch < 2.1), :func:`parse_oom_message` (both, with or without
the total capacity), :func:`classify_oom`, :func:`classify_error`,
:func:`estimate_step_activation_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inferctl.contract.oom import (  # noqa: F401 - re-exported
    ERROR_OOM, OomInfo, classify_error_text, classify_oom, parse_cuda_error_code,
    parse_oom_message_strict as parse_oom_message)
from inferctl.contract.units import GiB, KiB, MiB, format_size  # noqa: F401 - re-exported

#: PyTorch rounds every allocation up to 512 bytes (``kMinBlockSize`` in
#: c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK_SIZE = 512


# ---------------------------------------------------------------------------- message format
def format_oom_message(requested: int, total: int | None, free: int | None, allocated: int,
                       reserved_unallocated: int, device: int = 0, process_in_use: int | None = None,
                       device_kind: str = "CUDA") -> str:
    """PyTorch's current (>= 2.1) CUDA OOM message, as raised by the caching allocator.

    ``total=None`` / ``free=None`` leave out that clause (some wrappers print the message
    without it; F13 (b), (c)). ``process_in_use`` defaults to ``allocated + reserved_unallocated``.
    """
    in_use = allocated + reserved_unallocated if process_in_use is None else process_in_use
    head = f"{device_kind} out of memory. Tried to allocate {format_size(requested)}. "
    if total is not None and free is not None:
        head += (f"GPU {device} has a total capacity of {format_size(total)} "
                 f"of which {format_size(free)} is free. ")
    elif total is not None:
        head += f"GPU {device} has a total capacity of {format_size(total)}. "
    elif free is not None:
        head += f"GPU {device} has {format_size(free)} free. "
    return (head
            + f"Including non-PyTorch memory, this process has {format_size(in_use)} memory in use. "
            + f"Of the allocated memory {format_size(allocated)} is allocated by PyTorch, and "
            + f"{format_size(reserved_unallocated)} is reserved by PyTorch but unallocated. "
            + "If reserved but unallocated memory is large try setting "
            + "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
            + "See documentation for Memory Management  "
            + "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def format_oom_message_old(requested: int, total: int | None, free: int | None, allocated: int,
                           reserved: int, device: int = 0) -> str:
    """PyTorch's old (< 2.1) CUDA OOM message: ``Tried to allocate R (GPU 0; T total capacity;
    A already allocated; F free; V reserved in total by PyTorch)``."""
    cap = f"{format_size(total)} total capacity; " if total is not None else ""
    free_clause = f"{format_size(free)} free; " if free is not None else ""
    return (f"CUDA out of memory. Tried to allocate {format_size(requested)} (GPU {device}; {cap}"
            f"{format_size(allocated)} already allocated; {free_clause}"
            f"{format_size(reserved)} reserved in total by PyTorch) If reserved memory is >> "
            "allocated memory try setting max_split_size_mb to avoid fragmentation.  "
            "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")


# ---------------------------------------------------------------------------- error classes
def classify_error(exc: BaseException, oom_codes: frozenset[int] | set[int]) -> str:
    """``"oom"`` for ``torch.OutOfMemoryError`` or a CUDA error whose code is in ``oom_codes``;
    ``"hardware"`` for Xid / "GPU is lost" / uncorrectable ECC (214) / sticky 700–719 errors
    (never an int8 trigger, checked before the OOM codes); else ``"other"``
    (:func:`inferctl.contract.oom.classify_error_text`)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return ERROR_OOM
    return classify_error_text(str(exc), oom_codes)


# ---------------------------------------------------------------------------- activations
def estimate_step_activation_bytes(num_tokens: int, num_logits: int, sum_q_ctx: int, sum_ctx: int,
                                   dim: int, hidden_dim: int, n_heads: int, n_kv_heads: int,
                                   vocab_size: int, act_bytes: int, num_logprob_rows: int = 0) -> int:
    """Peak activation bytes of one forward step (one layer's temporaries live at a time).

    ``act_bytes × [T·(4·dim + 2·kv_dim + 3·hidden)      hidden states x, h, q, out; k, v; MLP
                   + 2·heads·Σ qᵢ·ctxᵢ                  attention scores and probabilities
                   + 2·kv_dim·Σ ctxᵢ]                    K/V gathered from the paged cache
      + 4·N·vocab                                        float32 logits
      + 4·R·vocab``                                      float32 log_softmax of prompt-logprob rows
    with T the step's tokens, qᵢ the new tokens and ctxᵢ the context (cached + new) of
    sequence i, kv_dim = n_kv_heads·dim/n_heads, N the logits rows (one per sequence, or
    every new token of a chunk that computes prompt logprobs) and R the rows whose
    ``log_softmax`` is taken for prompt logprobs (live together with the logits). Monotone in
    T, N, R, qᵢ and ctxᵢ. An engineering estimate of the eager PyTorch forward (not a
    measured profile).
    """
    kv_dim = n_kv_heads * (dim // n_heads)
    per_token = 4 * dim + 2 * kv_dim + 3 * hidden_dim
    elems = num_tokens * per_token + 2 * n_heads * sum_q_ctx + 2 * kv_dim * sum_ctx
    return int(act_bytes * elems + 4 * (num_logits + num_logprob_rows) * vocab_size)


# ---------------------------------------------------------------------------- allocator
@dataclass
class _Block:
    offset: int
    size: int
    handle: int | None  # None = free (cached)


@dataclass
class _Segment:
    size: int
    blocks: list[_Block] = field(default_factory=list)

    @property
    def fully_free(self) -> bool:
        return all(b.handle is None for b in self.blocks)


class SimulatedCachingAllocator:
    """A small model of PyTorch's CUDA caching allocator for a device of ``capacity`` bytes.

    ``malloc`` rounds to 512 bytes, takes the best-fitting cached free block (splitting it),
    else reserves a new segment of the rounded size; if the device is full it releases every
    fully free cached segment and tries again, then raises ``torch.OutOfMemoryError``.
    ``free`` returns the block to its segment's cache (coalescing neighbours); memory stays
    reserved until ``empty_cache``. Simplification: one segment per new reservation, no
    small/large pools, no streams.
    """

    def __init__(self, capacity: int, device_index: int = 0):
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0 bytes, got {capacity}")
        self.capacity = int(capacity)
        self.device_index = device_index
        self._segments: list[_Segment] = []
        self._where: dict[int, tuple[_Segment, _Block]] = {}
        self._next_handle = 1
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    @property
    def free(self) -> int:
        """Device memory not reserved by this allocator."""
        return self.capacity - self.reserved

    def malloc(self, nbytes: int, force_oom: bool = False) -> int:
        """Allocate ``nbytes``; returns a handle. Raises ``torch.OutOfMemoryError`` (with an
        ``oom_info`` attribute) when it cannot. ``force_oom`` treats the device as full."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        size = max(MIN_BLOCK_SIZE, -(-int(nbytes) // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE)
        if not force_oom:
            handle = self._from_cache(size)
            if handle is not None:
                return handle
            if self.reserved + size <= self.capacity:
                return self._new_segment(size)
        self.empty_cache()   # PyTorch releases cached segments before giving up
        if not force_oom and self.reserved + size <= self.capacity:
            return self._new_segment(size)
        free = 0 if force_oom else self.free
        info = OomInfo(size, free, self.allocated, self.reserved - self.allocated, self.capacity,
                       self.device_index, "new")
        message = format_oom_message(size, self.capacity, free, self.allocated,
                                     self.reserved - self.allocated, self.device_index)
        err = torch.OutOfMemoryError(message)
        err.oom_info = OomInfo(**{**info.__dict__, "message": message})
        raise err

    def _from_cache(self, size: int) -> int | None:
        best: tuple[_Segment, int] | None = None
        for seg in self._segments:
            for i, b in enumerate(seg.blocks):
                if b.handle is None and b.size >= size and (best is None or b.size < best[0].blocks[best[1]].size):
                    best = (seg, i)
        if best is None:
            return None
        seg, i = best
        block = seg.blocks[i]
        if block.size > size:
            seg.blocks.insert(i + 1, _Block(block.offset + size, block.size - size, None))
            block.size = size
        return self._hand_out(seg, block)

    def _new_segment(self, size: int) -> int:
        seg = _Segment(size, [_Block(0, size, None)])
        self._segments.append(seg)
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return self._hand_out(seg, seg.blocks[0])

    def _hand_out(self, seg: _Segment, block: _Block) -> int:
        handle = self._next_handle
        self._next_handle += 1
        block.handle = handle
        self._where[handle] = (seg, block)
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return handle

    def free_block(self, handle: int) -> None:
        """Return an allocation to the cache. Raises ``KeyError`` for an unknown handle."""
        seg, block = self._where.pop(handle)
        block.handle = None
        self.allocated -= block.size
        merged: list[_Block] = []
        for b in seg.blocks:
            if merged and merged[-1].handle is None and b.handle is None:
                merged[-1].size += b.size
            else:
                merged.append(b)
        seg.blocks = merged

    def empty_cache(self) -> int:
        """Release every fully free segment; returns the bytes released."""
        keep, released = [], 0
        for seg in self._segments:
            if seg.fully_free:
                released += seg.size
            else:
                keep.append(seg)
        self._segments = keep
        self.reserved -= released
        return released

    def size_of(self, handle: int) -> int:
        return self._where[handle][1].size


# ---------------------------------------------------------------------------- accountant
class MemoryAccountant:
    """Accounts the engine's device memory against ``budget_bytes``.

    CPU (``device.type == "cpu"``): a :class:`SimulatedCachingAllocator` of ``budget_bytes``
    capacity holds the bytes (no real memory is taken by the accountant). CUDA: allocations
    are real; :meth:`allocate` only records the bytes of tensors the caller creates, and
    :meth:`reserve_activations` really allocates (then frees into PyTorch's cache, where the
    forward reuses it), so a step that does not fit raises PyTorch's own OOM.

    Every allocation carries a tag (``"weights"``, ``"kv_cache"``, ``"activations"``).
    """

    def __init__(self, budget_bytes: int, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.budget_bytes = int(budget_bytes)
        if self.budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
        index = self.device.index or 0
        self._device_index = index
        self._sim = None if self.is_cuda else SimulatedCachingAllocator(self.budget_bytes, index)
        self._tags: dict[int, tuple[str, int]] = {}
        self._sizes: dict[int, int] = {}
        self._next_handle = 1
        self._by_tag: dict[str, int] = {}
        self._injected = 0
        if self.is_cuda:
            total = torch.cuda.get_device_properties(self.device).total_memory
            if self.budget_bytes < total:
                torch.cuda.set_per_process_memory_fraction(self.budget_bytes / total, self.device)

    # -- numbers
    @property
    def allocated_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.is_cuda else self._sim.allocated

    @property
    def reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved(self.device) if self.is_cuda else self._sim.reserved

    @property
    def free_bytes(self) -> int:
        """Budget not reserved (CUDA: also bounded by the device's free memory)."""
        free = self.budget_bytes - self.reserved_bytes
        if self.is_cuda:
            free = min(free, torch.cuda.mem_get_info(self.device)[0])
        return max(0, free)

    def bytes_by_tag(self, tag: str) -> int:
        return self._by_tag.get(tag, 0)

    # -- allocations
    def allocate(self, nbytes: int, tag: str) -> int:
        """Account ``nbytes`` under ``tag``; returns a handle for :meth:`free`.
        Raises ``torch.OutOfMemoryError`` (CPU) when the budget cannot hold it."""
        sim_handle = self._sim.malloc(nbytes) if self._sim is not None else 0
        handle = self._next_handle
        self._next_handle += 1
        self._tags[handle] = (tag, sim_handle)
        size = self._sim.size_of(sim_handle) if self._sim is not None else int(nbytes)
        self._by_tag[tag] = self._by_tag.get(tag, 0) + size
        self._sizes[handle] = size
        return handle

    def free(self, handle: int) -> None:
        """Release an allocation made by :meth:`allocate` (it stays reserved, cached)."""
        tag, sim_handle = self._tags.pop(handle)
        size = self._sizes.pop(handle)
        self._by_tag[tag] -= size
        if self._sim is not None:
            self._sim.free_block(sim_handle)

    def inject_oom(self, count: int = 1) -> None:
        """Make the next ``count`` activation reservations fail with a real
        ``torch.OutOfMemoryError`` (the device is treated as full)."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self._injected += count

    @property
    def pending_injected_ooms(self) -> int:
        return self._injected

    def reserve_activations(self, nbytes: int) -> int:
        """Reserve a step's activations before the forward; :meth:`release_activations`
        after. Raises ``torch.OutOfMemoryError`` with an ``oom_source`` (``"budget"``,
        ``"cuda"`` or ``"injected"``) attribute and an ``oom_info`` one (absent for a CUDA
        message without a "Tried to allocate" clause)."""
        injected = self._injected > 0
        if injected:
            self._injected -= 1
        if self._sim is not None:
            try:
                sim_handle = self._sim.malloc(nbytes, force_oom=injected)
            except torch.OutOfMemoryError as err:
                err.oom_source = "injected" if injected else "budget"
                raise
            handle = self._next_handle
            self._next_handle += 1
            size = self._sim.size_of(sim_handle)
            self._tags[handle] = ("activations", sim_handle)
            self._sizes[handle] = size
            self._by_tag["activations"] = self._by_tag.get("activations", 0) + size
            return handle
        if injected:   # CUDA, injected: real numbers, the device treated as full
            torch.cuda.empty_cache()
            alloc, reserved = self.allocated_bytes, self.reserved_bytes
            message = format_oom_message(nbytes, self.budget_bytes, 0, alloc, reserved - alloc,
                                         self._device_index)
            err = torch.OutOfMemoryError(message)
            err.oom_info = parse_oom_message(message)
            err.oom_source = "injected"
            raise err
        try:
            probe = torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)
        except torch.OutOfMemoryError as err:
            err.oom_source = "cuda"
            try:
                err.oom_info = parse_oom_message(str(err))
            except ValueError:   # e.g. "CUDA error: out of memory": no numbers, still an OOM
                pass
            raise
        del probe   # stays in PyTorch's cache; the forward's temporaries reuse it
        return 0

    def release_activations(self, handle: int) -> None:
        if self._sim is not None and handle:
            self.free(handle)

    def empty_cache(self) -> int:
        """Release cached, fully free segments. Returns bytes released (CUDA: measured)."""
        if self._sim is not None:
            return self._sim.empty_cache()
        before = self.reserved_bytes
        torch.cuda.empty_cache()
        return max(0, before - self.reserved_bytes)

    def snapshot(self) -> dict:
        """Current numbers in bytes: budget, allocated, reserved, reserved-unallocated, free,
        and per tag (weights, kv_cache, activations)."""
        allocated, reserved = self.allocated_bytes, self.reserved_bytes
        return {
            "budget_bytes": self.budget_bytes,
            "allocated_bytes": allocated,
            "reserved_bytes": reserved,
            "reserved_unallocated_bytes": reserved - allocated,
            "free_bytes": self.free_bytes,
            "weights_bytes": self.bytes_by_tag("weights"),
            "kv_pool_bytes": self.bytes_by_tag("kv_cache"),
            "activation_bytes": self.bytes_by_tag("activations"),
        }
