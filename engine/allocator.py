"""A small model of PyTorch's CUDA caching allocator, for the CPU engine's memory accounting.

Memory is *reserved* in segments and *allocated* in blocks carved out of them; a freed block
stays reserved (cached) until ``empty_cache()`` releases its segment, and only a segment with no
live block can be released (``c10/cuda/CUDACachingAllocator.cpp``). Reserved-but-unallocated
memory is therefore the allocator's fragmentation. When a request does not fit, the allocator
first releases every fully free cached segment (as PyTorch does) and then raises a real
``torch.OutOfMemoryError`` whose message has PyTorch's current format.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inferctl.contract.oom import FORMAT_NEW, OomInfo
from inferctl.engine.oom import format_oom_message

#: PyTorch rounds every allocation up to 512 bytes (``kMinBlockSize`` in
#: c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK_SIZE = 512


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
                       self.device_index, FORMAT_NEW)
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
