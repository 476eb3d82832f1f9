"""The paged KV cache: one preallocated tensor of fixed-size blocks, shared by all layers.

Layout [num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim]: each layer's K (and V)
is one contiguous [num_blocks, block_size, Hkv, D] tensor, and one block's keys are one contiguous run
of memory, which is what the CPU attention gathers.

On the CPU the cache is mapped lazily (a large budget costs nothing until used), and its pages are
populated in bulk a margin ahead of the newest block a step writes (`ensure_resident`): left to
fault one by one inside the steps, scattered over every layer's keys and values, the same pages
cost several times as much. The blocks a job's first steps fill can be mapped on a thread before
any step runs (`premap`): the runner makes the cache before the model loads, whose ~0.7 s leave a
core idle.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
import threading

import numpy as np
import psutil
import torch

from bulkrun.model.config import ModelConfig

CPU_DEFAULT_FRACTION = 0.25  # of available memory
CPU_DEFAULT_CAP = 4 << 30
POPULATE_AHEAD_BYTES = 64 << 20  # populated past the newest block written: one bulk call per 64 MiB
MADV_POPULATE_WRITE = 23  # Linux >= 5.14: map pages writable now, their contents unchanged
POPULATE_THREADS = 8  # the kernel maps pages on each caller's CPU; more threads mostly add start-up
PREMAP_CAP_BYTES = 512 << 20  # at most this much of the cache is mapped ahead of a run (premap)
PREMAP_STRETCH_BYTES = 32 << 20  # premap's thread maps this much at a time, so a step waits for little


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty(0, dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * element


def default_cpu_kv_bytes() -> int:
    return int(min(CPU_DEFAULT_FRACTION * psutil.virtual_memory().available, CPU_DEFAULT_CAP))


class KVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype, device):
        if num_blocks < 1:
            raise ValueError(
                f"the KV cache budget holds no block of {block_size} tokens "
                f"({bytes_per_block(cfg, block_size, dtype)} bytes each); raise kv_cache_bytes"
            )
        shape = (cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.num_blocks, self.block_size = num_blocks, block_size
        device = torch.device(device)
        self.data = _zeros(shape, dtype, device)
        # Never-written slots are read (and masked) when a group is padded: they must be finite.
        self.layers = [(self.data[i, 0], self.data[i, 1]) for i in range(cfg.num_layers)]
        self._ahead = max(1, POPULATE_AHEAD_BYTES // bytes_per_block(cfg, block_size, dtype))
        # blocks below this one are mapped (device memory, or a CPU mapping populated this far)
        self.resident_blocks = num_blocks if device.type != "cpu" or _madvise() is None else 0
        self._premapping: _Premapping | None = None  # premap's thread, until a step needs the pages

    @classmethod
    def from_budget(cls, cfg: ModelConfig, budget_bytes: int, block_size: int, dtype, device) -> KVCache:
        return cls(cfg, budget_bytes // bytes_per_block(cfg, block_size, dtype), block_size, dtype, device)

    def copy_slots(self, copies: list[tuple[int, int, int]]) -> None:
        """(source block, destination block, n): the source's first n slots into the destination's,
        every layer's keys and values (a prompt sharing a cached block's leading tokens, a scoring
        child its parent's last block)."""
        for source, destination, n in copies:
            if source != destination:
                self.data[:, :, destination, :n] = self.data[:, :, source, :n]

    def holds(self, cfg: ModelConfig, dtype: torch.dtype) -> bool:
        """Whether this cache has the layout a model of cfg in dtype needs (one made before the
        model loaded, from its config)."""
        layers, _, _, _, heads, dim = self.data.shape
        return self.data.dtype == dtype and (layers, heads, dim) == (
            cfg.num_layers,
            cfg.num_kv_heads,
            cfg.head_dim,
        )

    def premap(self, tokens: int) -> None:
        """Start mapping, on a thread of its own, the pages of the blocks that `tokens` tokens fill
        first (at most PREMAP_CAP_BYTES; the pool hands never-used blocks out in ascending order),
        a stretch at a time. The first ensure_resident stops it after its current stretch and keeps
        what it mapped. Nothing where pages are already mapped."""
        if self.resident_blocks > 0 or self._premapping is not None:
            return
        block_bytes = self.data[:, :, 0].nbytes  # every layer's keys and values
        end = min(self.num_blocks, -(-tokens // self.block_size), max(1, PREMAP_CAP_BYTES // block_bytes))
        step = max(1, PREMAP_STRETCH_BYTES // block_bytes)
        stretches = [(min(end, s + step), self._ranges(s, min(end, s + step))) for s in range(0, end, step)]
        state = _Premapping()

        def run() -> None:  # one thread: it runs beside the model's load, which leaves a core idle
            for stretch_end, ranges in stretches:
                if state.stop.is_set() or not _populate(ranges, threads=1):
                    return
                state.mapped = stretch_end

        state.thread = threading.Thread(target=run, daemon=True, name="bulkrun-kv-premap")
        self._premapping = state
        state.thread.start()

    def ensure_resident(self, newest_block: int) -> None:
        """Map, in bulk, the pages of every block up to `newest_block` (the highest a step writes)
        and a margin past it, unless they are already. The pool hands never-used blocks out in
        ascending order, so what is mapped tracks the run's peak use. Contents never change."""
        self.stop_premap()
        if newest_block < self.resident_blocks:
            return
        start, end = self.resident_blocks, min(self.num_blocks, newest_block + 1 + self._ahead)
        if _populate(self._ranges(start, end), threads=min(POPULATE_THREADS, torch.get_num_threads())):
            self.resident_blocks = end
        else:  # not supported here: pages fault in as they are written
            self.resident_blocks = self.num_blocks

    def stop_premap(self) -> None:
        """Stop premap's thread after its current stretch, keeping what it mapped."""
        if self._premapping is not None:
            state, self._premapping = self._premapping, None
            state.stop.set()
            state.thread.join()
            self.resident_blocks = max(self.resident_blocks, state.mapped)

    def _ranges(self, start: int, end: int) -> list[tuple[int, int]]:
        """Blocks start .. end-1 as one address range per layer and k/v, from the page holding block
        `start` (its head may belong to a block in use: populating leaves contents alone)."""
        return [(r[start].data_ptr(), r[start:end].nbytes) for r in self.data.flatten(0, 1)]


class _Premapping:
    """KVCache.premap's thread, its stop flag, and the blocks below `mapped`, which it has mapped."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.mapped = 0


def _zeros(shape, dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    # An anonymous mapping: the kernel hands out zero pages lazily, so a large cache costs nothing
    # until used (torch.zeros writes every byte up front: seconds per GiB here). Plain 4 KiB pages:
    # numpy's calloc asks for huge pages, whose first touch stalled writes up to 9 ms on compaction.
    nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    buffer = mmap.mmap(-1, nbytes)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)


@functools.cache
def _madvise():
    """libc's madvise, or None where it cannot be had."""
    if not sys.platform.startswith("linux"):  # MADV_POPULATE_WRITE's number is Linux's
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).madvise
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def _populate(ranges: list[tuple[int, int]], threads: int) -> bool:
    """MADV_POPULATE_WRITE over (address, length) ranges, split over `threads` threads (ctypes
    releases the GIL; the kernel maps pages on each thread's own CPU). False where unsupported."""
    madvise, page = _madvise(), mmap.PAGESIZE
    failed = []

    def run(part: list[tuple[int, int]]) -> None:
        for address, length in part:
            first = address - address % page
            if madvise(first, address + length - first, MADV_POPULATE_WRITE) != 0:
                failed.append(ctypes.get_errno())
                return

    n = max(1, min(threads, len(ranges)))
    parts = [ranges[i::n] for i in range(n)]
    workers = [threading.Thread(target=run, args=(part,)) for part in parts[1:]]
    for worker in workers:
        worker.start()
    run(parts[0])
    for worker in workers:
        worker.join()
    return not failed
