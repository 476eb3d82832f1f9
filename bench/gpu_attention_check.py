"""Paged attention at production shapes against an fp32 reference (gpu_check.sh stage 03).

bf16, head_dim 64 and 128 (Llama-3.2-1B's and Llama-3.1-8B's 32 query / 8 kv heads), contexts of
thousands of keys, decode-only and mixed batches; each case with the partitions the wrapper plans,
unsplit, and a forced split. Printed and written as JSON: the max error of every case, the binaries
Triton compiled (a second sweep at new batch sizes and block-table widths must compile nothing), a
CUDA-graph capture replayed on new inputs, and decode timings split vs unsplit.

    python bench/gpu_attention_check.py --device cuda --json out.json
    TRITON_INTERPRET=1 python bench/gpu_attention_check.py --device cpu --tiny   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from bulkrun_kernels import paged_attention as pa
from bulkrun_kernels import reference

BF16_ATOL = 3e-2  # outputs are averages of N(0, 1) values: |o| < ~1, bf16 keeps 8 bits


@dataclass(frozen=True)
class Case:
    name: str
    query_lens: list[int]
    context_lens: list[int]


def cases(tiny: bool) -> list[Case]:
    if tiny:  # the interpreter: one long-ish row, one chunk
        return [Case("decode", [1, 1], [300, 5]), Case("mixed", [1, 20, 1], [200, 40, 17])]
    g = torch.Generator().manual_seed(0)
    spread = lambda n, lo, hi: torch.randint(lo, hi + 1, (n,), generator=g).tolist()  # noqa: E731
    return [
        Case("decode-b1-8192", [1], [8192]),
        Case("decode-b8-long", [1] * 8, spread(8, 4096, 8192)),
        Case("decode-b256", [1] * 256, spread(256, 100, 4000)),
        Case("mixed-chunk2048", [2048] + [1] * 64, [3048] + spread(64, 1, 3000)),
    ]


def make_batch(
    case: Case, hq: int, hkv: int, head_dim: int, dtype, device, block_size: int = 16, seed: int = 0
):
    """Random q and cache; each sequence's blocks scattered over the pool (tail blocks unused)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    blocks = [-(-c // block_size) for c in case.context_lens]
    num_blocks = sum(blocks) + 8
    perm = torch.randperm(num_blocks, generator=g)
    width = max(blocks) + 3  # wider than needed, as a runner's table can be
    tables = torch.zeros(len(blocks), width, dtype=torch.int32)
    used = 0
    for s, n in enumerate(blocks):
        tables[s, :n] = perm[used : used + n]
        used += n
    shape = (num_blocks, block_size, hkv, head_dim)
    gd = torch.Generator(device=device).manual_seed(seed)  # gigabytes of keys: drawn where they live
    k_cache = torch.randn(shape, generator=gd, device=device).to(dtype)
    v_cache = torch.randn(shape, generator=gd, device=device).to(dtype)
    q = torch.randn(sum(case.query_lens), hq, head_dim, generator=gd, device=device).to(dtype)
    qsl = torch.tensor(
        [0, *torch.tensor(case.query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device
    )
    seq_lens = torch.tensor(case.context_lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables.to(device), qsl, seq_lens


def fp32_reference(batch, scale):
    q, k_cache, v_cache, tables, qsl, seq_lens = batch
    return reference.paged_attention(
        q.float(), k_cache.float(), v_cache.float(), tables, qsl, seq_lens, scale
    )


def check_errors(args, device, dtype) -> tuple[list[dict], bool]:
    rows, ok = [], True
    atol = BF16_ATOL if dtype != torch.float32 else 1e-4
    for head_dim in (64, 128):
        hq, hkv = (4, 1) if args.tiny else (32, 8)
        for case in cases(args.tiny):
            batch = make_batch(case, hq, hkv, head_dim, dtype, device)
            scale = head_dim**-0.5
            want = fp32_reference(batch, scale)
            for label, parts in (("planned", None), ("unsplit", 1), ("split8", 8)):
                got = pa.paged_attention(*batch, scale, num_partitions=parts)
                err = (got.float() - want).abs().max().item()
                good = err <= atol and not torch.isnan(got).any().item()
                ok &= good
                planned = parts or _planned(batch, head_dim)
                rows.append({"head_dim": head_dim, "case": case.name, "partitions": planned, "mode": label,
                             "max_abs_error": err, "ok": good})  # fmt: skip
                print(f"d{head_dim:<4} {case.name:<18} {label:<8} partitions={planned:<3} "
                      f"max|err|={err:.2e} {'ok' if good else 'FAIL'}", flush=True)  # fmt: skip
            del batch, want
    return rows, ok


def _planned(batch, head_dim) -> int:
    q, k_cache, _, tables, _, seq_lens = batch
    num_tokens, hq, _ = q.shape
    group = hq // k_cache.shape[2]
    _, block_q, _ = pa._pick_blocks(num_tokens, seq_lens.shape[0], group)
    pad = max(16, 1 << (head_dim - 1).bit_length())
    return pa.plan_partitions(num_tokens, seq_lens.shape[0], block_q, k_cache.shape[2],
                              tables.shape[1] * k_cache.shape[1], hq * pad * 4, pa._sm_count(q.device))  # fmt: skip


def binaries(device) -> dict[str, int]:
    """Binaries Triton holds per kernel (its per-device cache). Raises when this Triton keeps them
    where this check cannot look: a recompile check that cannot count must not pass."""
    import triton

    counts = {}
    for name in ("_paged_attention_kernel", "_reduce_partitions_kernel"):
        kernel = getattr(pa, name)
        caches = getattr(kernel, "device_caches", None)
        if not isinstance(caches, dict):
            raise RuntimeError(
                f"cannot count the binaries of {name}: Triton {triton.__version__} has no "
                "JITFunction.device_caches dict (the recompile check needs updating for it)"
            )
        counts[name] = sum(len(c[0]) for c in caches.values())
    return counts


def check_no_recompiles(device, dtype) -> tuple[dict, bool]:
    """After the error sweep, steps at new batch sizes / widths / contexts must reuse the binaries."""
    before = binaries(device)
    g = torch.Generator().manual_seed(1)
    for num_seqs in (3, 17, 100, 333):
        contexts = torch.randint(1, 3000, (num_seqs,), generator=g).tolist()
        for head_dim in (64, 128):
            batch = make_batch(Case("sweep", [1] * num_seqs, contexts), 32, 8, head_dim, dtype, device)
            for parts in (None, 1, 5):
                pa.paged_attention(*batch, head_dim**-0.5, num_partitions=parts)
    after = binaries(device)
    result = {"binaries_after_error_sweep": before, "binaries_after_new_shapes": after}
    ok = before == after
    print(f"binaries per kernel: {before} -> after new batch sizes/widths: {after} "
          f"({'no recompiles' if ok else 'RECOMPILED'})", flush=True)  # fmt: skip
    return result, ok


def check_cuda_graph(device, dtype) -> tuple[dict, bool]:
    """Capture a split and an unsplit decode batch; replay on new contexts; equal to eager."""
    result, ok = {}, True
    for parts in (None, 1):
        case = Case("graph", [1] * 4, [8000, 3000, 50, 1])
        q, k_cache, v_cache, tables, qsl, seq_lens = make_batch(case, 32, 8, 128, dtype, device)
        out = torch.empty_like(q)
        scale = 128**-0.5
        pa.paged_attention(q, k_cache, v_cache, tables, qsl, seq_lens, scale, out=out, num_partitions=parts)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pa.paged_attention(
                q, k_cache, v_cache, tables, qsl, seq_lens, scale, out=out, num_partitions=parts
            )
        seq_lens.copy_(torch.tensor([20, 7000, 4000, 2], dtype=torch.int32, device=device))
        tables.copy_(tables.flip(0))
        q.normal_()
        graph.replay()
        torch.cuda.synchronize()
        eager = pa.paged_attention(q, k_cache, v_cache, tables, qsl, seq_lens, scale, num_partitions=parts)
        same = torch.equal(out, eager)
        ok &= same
        label = "planned" if parts is None else "unsplit"
        result[label] = same
        print(
            f"CUDA graph ({label}): replay on new contexts {'equals' if same else 'DIFFERS from'} eager",
            flush=True,
        )
    return result, ok


def time_decode(device, dtype) -> list[dict]:
    """Decode step time at 8,192 keys per sequence, planned (split) vs unsplit."""
    rows = []
    for num_seqs in (1, 8, 64):
        case = Case("time", [1] * num_seqs, [8192] * num_seqs)
        batch = make_batch(case, 32, 8, 128, dtype, device)
        kv_bytes = 2 * num_seqs * 8192 * 8 * 128 * batch[1].element_size()
        for label, parts in (("planned", None), ("unsplit", 1)):
            ms = _median_ms(lambda b=batch, n=parts: pa.paged_attention(*b, 0.088, num_partitions=n))
            rows.append({"num_seqs": num_seqs, "mode": label, "ms": ms, "kv_gb_per_s": kv_bytes / ms / 1e6})
            print(f"decode b={num_seqs:<3} ctx=8192 d128 {label:<8} {ms:7.3f} ms  "
                  f"{kv_bytes / ms / 1e6:7.0f} GB/s of K/V", flush=True)  # fmt: skip
        del batch
    return rows


def _median_ms(fn, reps: int = 20) -> float:
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="small shapes (the interpreter's smoke run)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_attention_check: error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    dtype = torch.bfloat16
    figures: dict = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": "bfloat16",
    }
    figures["errors"], ok = check_errors(args, device, dtype)
    if device.type == "cuda":
        figures["recompiles"], good = check_no_recompiles(device, dtype)
        ok &= good
        figures["cuda_graph"], good = check_cuda_graph(device, dtype)
        ok &= good
        figures["decode_timing"] = time_decode(device, dtype)
    else:
        figures["recompiles"] = figures["cuda_graph"] = figures["decode_timing"] = "skipped: no CUDA"
        print("binaries, CUDA graph, timing: skipped: no CUDA")
    figures["ok"] = ok
    worst = max(row["max_abs_error"] for row in figures["errors"])
    print(f"FIGURE: max |error| {worst:.2e} over {len(figures['errors'])} cases; "
          f"recompiles: {'none' if isinstance(figures['recompiles'], dict) else figures['recompiles']}", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print("attention check: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
