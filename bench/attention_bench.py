"""The CPU paged attention op alone, on step shapes of the default model (9 q heads, 3 kv heads,
head_dim 64): prompt chunks and decode batches, bf16 batch invariant and not, fp32, against the
reference (torch SDPA per chunk and decode group, fp32 math).

    python bench/attention_bench.py
    BULKRUN_CPU_LIBRARY=path/to/bulkrun_cpu.so python bench/attention_bench.py

BULKRUN_CPU_LIBRARY loads another build of the native kernels (e.g. one of an older source, from
$BULKRUN_CACHE_DIR/kernels/<key>/) to compare kernels on the same machine. Medians of 15 calls;
GFLOP/s count the causal score and value products (4 * keys * heads * head_dim per query row).

Then decode steps as the engine meets them: 30 layers' caches, each layer called once per step, so
every key and value comes from DRAM (the first table's shapes fit in L3), with the sequences' blocks
contiguous (a fresh cache) and scattered (a long job's recycled blocks): bf16, batch invariant, best
of 6 steps, GB/s of keys and values read.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

H, KVH, D, BLOCK = 9, 3, 64, 16
SHAPES = {  # name: (context of each sequence, new tokens of each sequence)
    "prefill 8 x 256": ([256] * 8, [256] * 8),
    "prefill 4 x 512": ([512] * 4, [512] * 4),
    # a prompt step's chunks: 920 new tokens at the ends of six sequences of 70-311 tokens
    "chunks 920 tokens": ([247, 265, 70, 182, 311, 298], [170, 170, 70, 170, 170, 170]),
    "decode 48 @ 260": ([260] * 48, [1] * 48),
    "decode 256 @ 100": ([100] * 256, [1] * 256),
    "decode 8 @ 2000": ([2000] * 8, [1] * 8),
}


def step(lens: list[int], new: list[int], dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    blocks = [-(-n // BLOCK) for n in lens]
    k = torch.randn(sum(blocks) + 1, BLOCK, KVH, D, generator=g).to(dtype)
    v = torch.randn(sum(blocks) + 1, BLOCK, KVH, D, generator=g).to(dtype)
    table = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    first = 0
    for i, n in enumerate(blocks):
        table[i, :n] = torch.arange(first, first + n, dtype=torch.int32)
        first += n
    q = torch.randn(sum(new), H, D, generator=g).to(dtype)
    starts = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, table, starts, torch.tensor(lens, dtype=torch.int32)


def flops(lens: list[int], new: list[int]) -> float:
    return sum(4.0 * (n - m + t + 1) * H * D for n, m in zip(lens, new, strict=True) for t in range(m))


def median_s(fn, *args, calls: int = 15, **kwargs) -> float:
    for _ in range(3):
        fn(*args, **kwargs)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.parse_args()
    from bulkrun_kernels import cpu_build, reference

    if not cpu_build.load():
        raise SystemExit(f"no native kernels: {cpu_build.load_error()}")

    print(
        f"{'shape':18s} {'bf16 invariant':>16s} {'bf16 not inv.':>16s} {'fp32 invariant':>16s} {'reference':>16s}"
    )
    for name, (lens, new) in SHAPES.items():
        cells = []
        for dtype, invariant in ((torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)):
            q, k, v, table, starts, seq_lens = step(lens, new, dtype)
            out = torch.empty_like(q)
            op = torch.ops.bulkrun_cpu.paged_attention
            s = median_s(op, q, k, v, table, starts, seq_lens, D**-0.5, 0, None, 0.0, invariant, out)
            cells.append(f"{s * 1e3:6.2f} ms {flops(lens, new) / s / 1e9:5.0f}")
        q, k, v, table, starts, seq_lens = step(lens, new, torch.bfloat16)
        plan = reference.plan_attention(table, starts, seq_lens, BLOCK, q.dtype)
        args = (q, k, v, table, starts, seq_lens, D**-0.5)
        s = median_s(reference.paged_attention, *args, calls=5, plan=plan, batch_invariant=False)
        cells.append(f"{s * 1e3:6.2f} ms {flops(lens, new) / s / 1e9:5.0f}")
        print(f"{name:18s} " + " ".join(f"{c:>16s}" for c in cells), flush=True)
    print("(each cell: median time per call, GFLOP/s)")
    print(f"\n{'decode, from DRAM':18s} {'contiguous':>18s} {'scattered':>18s}")
    for name, (lens, _) in SHAPES.items():
        if name.startswith("decode"):
            cells = [cold_decode(lens, scattered) for scattered in (False, True)]
            print(f"{name:18s} " + " ".join(f"{c:>18s}" for c in cells), flush=True)
    print("(each cell: time per layer, GB/s of keys and values)")


def cold_decode(lens: list[int], scattered: bool, layers: int = 30) -> str:
    """One decode row per sequence over `layers` layers' caches, each layer once per step."""
    g = torch.Generator().manual_seed(0)
    per_seq = -(-max(lens) // BLOCK)
    total = 2 * len(lens) * per_seq  # half of it never read: the scattered blocks have room to scatter
    order = torch.randperm(total, generator=g) if scattered else torch.arange(total)
    table = order[: len(lens) * per_seq].to(torch.int32).view(len(lens), per_seq).contiguous()
    caches = [
        tuple(torch.randn(total, BLOCK, KVH, D, generator=g).bfloat16() for _ in range(2))
        for _ in range(layers)
    ]
    q = torch.randn(len(lens), H, D, generator=g).bfloat16()
    out = torch.empty_like(q)
    starts = torch.arange(len(lens) + 1, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    op = torch.ops.bulkrun_cpu.paged_attention

    def step():
        for k, v in caches:
            op(q, k, v, table, starts, seq_lens, D**-0.5, 0, None, 0.0, True, out)

    step()
    best = float("inf")
    for _ in range(6):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    per_layer = best / layers
    read = sum(lens) * KVH * D * 2 * 2  # keys and values, bf16
    return f"{per_layer * 1e3:6.3f} ms {read / per_layer / 1e9:5.1f}"


if __name__ == "__main__":
    main()
