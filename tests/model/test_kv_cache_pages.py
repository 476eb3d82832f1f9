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


def first_blocks_mapped(cache: KVCache, n: int) -> bool:
    """Whether blocks 0 .. n-1 of every layer's keys and values are mapped."""
    return all(resident_fraction(region[:n]) == 1.0 for region in cache.data.flatten(0, 1))


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


def test_premapping_maps_the_first_blocks_on_a_thread_and_keeps_every_written_value(monkeypatch):
    monkeypatch.setattr(kv_cache, "POPULATE_AHEAD_BYTES", 8 * 6 * 4096)  # 8 blocks ahead
    cache = KVCache(SHAPE, 512, 16, torch.bfloat16, "cpu")
    cache.premap(100 * 16)  # the first 100 blocks' tokens
    written = torch.randn(3, 2, 4, 16, 2, 64).bfloat16()
    cache.data[:, :, :4] = written  # a step's writes may meet the thread at work
    cache.ensure_resident(3)  # waits for the thread, and keeps what it mapped
    assert cache.resident_blocks == 100
    assert first_blocks_mapped(cache, 100)
    assert resident_fraction(cache.data[1, 0, 120:200]) == 0  # past the premapped blocks: unmapped
    assert torch.equal(cache.data[:, :, :4], written) and not cache.data[:, :, 4:].any()
    cache.ensure_resident(150)  # past them: the steps map the rest as before
    assert cache.resident_blocks == 159 and first_blocks_mapped(cache, 159)


def test_a_step_stops_the_premapping_thread_and_maps_what_it_needs(monkeypatch):
    monkeypatch.setattr(kv_cache, "PREMAP_STRETCH_BYTES", 6 * 4096)  # a block at a time
    monkeypatch.setattr(kv_cache, "POPULATE_AHEAD_BYTES", 6 * 4096)
    cache = KVCache(SHAPE, 16384, 16, torch.bfloat16, "cpu")
    cache.premap(16384 * 16)  # every block (~100,000 calls), one block at a time
    cache.ensure_resident(9)
    done = cache.resident_blocks
    assert 11 <= done < 16384  # what the step needs, and whatever the thread had mapped when stopped
    assert first_blocks_mapped(cache, done)
    assert cache._premapping is None  # the thread has stopped: nothing maps behind the steps' backs
    cache.premap(16384 * 16)  # pages already mapped: no second thread
    assert cache._premapping is None


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
