"""The CPU KV cache maps its pages in bulk ahead of the blocks steps write, and never changes what
they hold (kv_cache.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
from types import SimpleNamespace

import pytest
import torch

from bulkrun.engine.worker import kv_cache
from bulkrun.engine.worker.kv_cache import KVCache

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
SHAPE = SimpleNamespace(num_layers=3, num_kv_heads=2, head_dim=64)  # 4 KiB per block per layer and k/v


def resident_fraction(t: torch.Tensor) -> float:
    """The share of t's pages mapped in memory (mincore)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    start = t.data_ptr() - t.data_ptr() % page
    pages = -(-(t.data_ptr() + t.nbytes - start) // page)
    flags = ctypes.create_string_buffer(pages)
    assert libc.mincore(start, pages * page, flags) == 0, ctypes.get_errno()
    return sum(b & 1 for b in flags.raw) / pages


def test_populating_maps_the_pages_ahead_and_keeps_every_written_value(monkeypatch):
    monkeypatch.setattr(kv_cache, "POPULATE_AHEAD_BYTES", 64 * 6 * 4096)  # 64 blocks ahead
    cache = KVCache(SHAPE, 512, 16, torch.bfloat16, "cpu")
    assert cache.resident_blocks == 0 and resident_fraction(cache.data[1, 0, 100:200]) == 0
    written = torch.randn(3, 2, 10, 16, 2, 64).bfloat16()
    cache.data[:, :, :10] = written  # blocks 0-9 in use, their pages faulted in by the writes

    cache.ensure_resident(9)
    assert cache.resident_blocks == 10 + 64
    for layer in range(3):
        for kv in range(2):
            assert resident_fraction(cache.data[layer, kv, :74]) == 1.0
    assert resident_fraction(cache.data[1, 0, 100:200]) == 0  # past the margin: still unmapped
    cache.ensure_resident(40)  # inside what is mapped: nothing to do
    assert cache.resident_blocks == 74

    cache.data[:, :, 74] = 7  # a block written right at the mapped edge, then the next stretch
    cache.ensure_resident(500)
    assert cache.resident_blocks == 512 and resident_fraction(cache.data) == 1.0
    assert torch.equal(cache.data[:, :, :10], written)
    assert bool((cache.data[:, :, 74] == 7).all()) and not cache.data[:, :, 75:].any()


def test_a_run_maps_every_block_the_pool_hands_out(tmp_path):
    from helpers.models import make_tiny_model

    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.core.params import EngineRequest, SamplingParams
    from bulkrun.engine.load import load_engine

    model = make_tiny_model(tmp_path / "model")
    engine = load_engine(str(model), EngineConfig(dtype="bfloat16", kv_cache_bytes=64 << 20))
    cache, pool = engine.runner.kv_cache, engine.scheduler.pool
    prompts = [list(range(5, 5 + n)) for n in (40, 200, 90, 300)]
    requests = [EngineRequest(f"r{i}", p, SamplingParams(max_tokens=20)) for i, p in enumerate(prompts)]
    list(engine.stream(requests))
    assert pool.num_touched_blocks > 0
    assert cache.resident_blocks >= pool.num_touched_blocks
    assert resident_fraction(cache.data[:, :, : pool.num_touched_blocks]) == 1.0
