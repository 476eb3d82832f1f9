"""What mapping the CPU KV cache's pages costs: faulted in by the writes themselves, as a step's
`write_kv` meets them (a few blocks at a time in every layer's keys and values), against mapped in
bulk ahead of them (KVCache.ensure_resident: MADV_POPULATE_WRITE over both cores), then written.

    python bench/kv_pages_bench.py [--blocks 900] [--rounds 3]

The default model's cache shape (30 layers, 3 kv heads of 64, 16-token blocks, bf16), a fresh
mapping per measurement, in alternating rounds. Prints seconds per round: the faulting writes, and
the bulk mapping plus the same writes. The writes alone (mapped pages) are a fixed cost of both.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch

from bulkrun.engine.worker.kv_cache import KVCache

SHAPE = SimpleNamespace(num_layers=30, num_kv_heads=3, head_dim=64)
BLOCKS_PER_STEP = 3  # new blocks a 48-row decode step takes in every layer


def write_blocks(cache: KVCache, blocks: int) -> None:
    rows = torch.ones(BLOCKS_PER_STEP, *cache.data.shape[3:], dtype=cache.data.dtype)
    for b in range(0, blocks, BLOCKS_PER_STEP):
        n = min(BLOCKS_PER_STEP, blocks - b)
        for k, v in cache.layers:
            k[b : b + n] = rows[:n]
            v[b : b + n] = rows[:n]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=900, help="blocks written (900: ~330 MB)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    size = args.blocks * 2 * SHAPE.num_layers * 16 * SHAPE.num_kv_heads * SHAPE.head_dim * 2
    print(f"{args.blocks} blocks in every layer's keys and values: {size / 2**20:.0f} MiB")
    for r in range(args.rounds):
        cache = KVCache(SHAPE, args.blocks + 1, 16, torch.bfloat16, "cpu")
        t0 = time.perf_counter()
        write_blocks(cache, args.blocks)
        faulted = time.perf_counter() - t0
        del cache
        cache = KVCache(SHAPE, args.blocks + 1, 16, torch.bfloat16, "cpu")
        t0 = time.perf_counter()
        cache.ensure_resident(args.blocks)
        mapped = time.perf_counter() - t0
        write_blocks(cache, args.blocks)
        total = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_blocks(cache, args.blocks)
        writes = time.perf_counter() - t0
        del cache
        print(
            f"round {r}: faulted by the writes {faulted:.3f} s; mapped in bulk {mapped:.3f} s + writes "
            f"= {total:.3f} s; the writes alone {writes:.3f} s"
        )


if __name__ == "__main__":
    main()
