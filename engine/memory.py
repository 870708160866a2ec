"""MemoryAccountant: every byte the engine puts on the device, against a budget.

On CPU a :class:`~inferctl.engine.allocator.SimulatedCachingAllocator` of the budget's capacity
holds the bytes (the allocator's fragmentation and real ``torch.OutOfMemoryError`` s included).
On CUDA the accountant reads the real numbers (``torch.cuda.mem_get_info``,
``memory_allocated``, ``memory_reserved``) and makes real allocations.
"""

from __future__ import annotations

import torch

from inferctl.contract.stats import SOURCE_BUDGET, SOURCE_CUDA, SOURCE_INJECTED
from inferctl.engine.allocator import SimulatedCachingAllocator
from inferctl.engine.oom import format_oom_message, parse_oom_message


class MemoryAccountant:
    """Accounts the engine's device memory against ``budget_bytes``.

    CPU (``device.type == "cpu"``): a :class:`SimulatedCachingAllocator` of ``budget_bytes``
    capacity holds the bytes (no real memory is taken by the accountant). CUDA: allocations
    are real; :meth:`allocate` only records the bytes of tensors the caller creates, and
    :meth:`reserve_activations` really allocates (then frees into PyTorch's cache, where the
    forward reuses it), so a step that does not fit raises PyTorch's own OOM.

    Every allocation carries a tag (``"weights"``, ``"kv_cache"``, ``"activations"``; with a
    speculative draft model also ``"draft_weights"``, ``"draft_kv_cache"``).
    """

    def __init__(self, budget_bytes: int, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda and self.device.index is None:
            # "cuda" means the current device; torch.cuda.set_per_process_memory_fraction takes
            # only an indexed one (its _get_device_index(device) without optional=True raised
            # "Expected a torch.device with a specified index" for `engine serve --device cuda`)
            self.device = torch.device("cuda", torch.cuda.current_device())
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
                err.oom_source = SOURCE_INJECTED if injected else SOURCE_BUDGET
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
            err.oom_source = SOURCE_INJECTED
            raise err
        try:
            probe = torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)
        except torch.OutOfMemoryError as err:
            err.oom_source = SOURCE_CUDA
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
        and per tag (weights, kv_cache, activations, the speculative draft's weights and KV pool)."""
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
            "draft_weights_bytes": self.bytes_by_tag("draft_weights"),
            "draft_kv_pool_bytes": self.bytes_by_tag("draft_kv_cache"),
        }
