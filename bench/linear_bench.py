"""One step's bf16 linears as the engine meets them: the default model's 30 layers (q/k/v, o, gate/up,
down; each layer its own weights, so every step streams them from DRAM, as a decode step does) and
its LM head, at several row counts: the fixed-order kernel the batch invariant engine runs
(bulkrun_kernels.cpu_gemm: AMX tiles or AVX512-BF16 dot products) against oneDNN on the whole batch
(what `--no-batch-invariant` runs at these row counts).

    python bench/linear_bench.py [--rows 8 48 256 1024]
    BULKRUN_CPU_LIBRARY=path/to/bulkrun_cpu.so python bench/linear_bench.py

--fp32: the 30 layers in fp32 instead: the panel kernel (`small_gemm`, what invariant fp32 layers
run), oneDNN in fixed tiles of --tile rows (the invariant fallback where the panel kernel is not
built) and oneDNN on the whole batch. With a build for an AVX2 CPU (-march=znver2, loaded by
BULKRUN_CPU_LIBRARY) and ONEDNN_MAX_CPU_ISA=AVX2, an AVX-512 box runs what an AVX2 CPU would.

Best of 5 sweeps; GFLOP/s count 2 * rows * weights.
"""

from __future__ import annotations

import argparse
import time

import torch

LAYERS = 30
HIDDEN, VOCAB = 576, 49152
SHAPES = [(960, HIDDEN), (HIDDEN, HIDDEN), (3072, HIDDEN), (HIDDEN, 1536)]  # (out, in) per layer


def best_s(fn, x, sweeps: int = 5) -> float:
    fn(x)
    best = float("inf")
    for _ in range(sweeps):
        t0 = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - t0)
    return best


def onednn_sweep(onednn: list[list[torch.Tensor]], x: dict[int, torch.Tensor]) -> None:
    """Every layer's linears on oneDNN's packed weights, one call each (x: the input by its width)."""
    for layer in onednn:
        for (_, k), w in zip(SHAPES, layer, strict=True):
            torch.ops.mkldnn._linear_pointwise(x[k], w, None, "none", [], "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 48, 256, 1024])
    parser.add_argument("--fp32", action="store_true", help="the layers in fp32: panels against oneDNN")
    parser.add_argument("--tile", type=int, default=None, help="--fp32: oneDNN's invariant row tile")
    args = parser.parse_args()
    if args.fp32:
        return fp32_body(args.rows, args.tile)
    from bulkrun_kernels import cpu_build
    from bulkrun_kernels.cpu_gemm import bf16_gemm, fixed_order_bf16_kernel, pack_amx

    if not cpu_build.load() or fixed_order_bf16_kernel() is None:
        raise SystemExit("no fixed-order bf16 kernel on this CPU (needs AVX512-BF16 or AMX)")
    g = torch.Generator().manual_seed(0)
    weights = [[torch.randn(n, k, generator=g).bfloat16() for n, k in SHAPES] for _ in range(LAYERS)]
    tiles = [[pack_amx(w) for w in layer] for layer in weights]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in layer] for layer in weights]
    head = torch.randn(VOCAB, HIDDEN, generator=g).bfloat16()
    head_tiles, head_onednn = pack_amx(head), torch.ops.mkldnn._reorder_linear_weight(head, 64)
    del weights, head
    body_flops = 2 * LAYERS * sum(n * k for n, k in SHAPES)
    print(f"fixed-order kernel: {fixed_order_bf16_kernel()}; {LAYERS} layers' linears, then the LM head")
    print(f"{'rows':>5s} {'body, ours':>20s} {'body, oneDNN':>20s} {'head, ours':>20s} {'head, oneDNN':>20s}")

    def ours(x):
        for layer in tiles:
            for (n, k), w in zip(SHAPES, layer, strict=True):
                bf16_gemm(x[k], w, None, n)

    def theirs(x):
        onednn_sweep(onednn, x)

    def head_ours(x):
        bf16_gemm(x[HIDDEN], head_tiles, None, VOCAB)

    def head_theirs(x):
        torch.ops.mkldnn._linear_pointwise(x[HIDDEN], head_onednn, None, "none", [], "")

    for m in args.rows:
        x = {k: torch.randn(m, k, generator=g).bfloat16() for k in {k for _, k in SHAPES}}
        head_flops = 2 * m * VOCAB * HIDDEN
        cells = []
        for fn, flops in ((ours, body_flops * m), (theirs, body_flops * m), (head_ours, head_flops),
                          (head_theirs, head_flops)):  # fmt: skip
            s = best_s(fn, x)
            cells.append(f"{s * 1e3:7.2f} ms {flops / s / 1e9:5.0f}")
        print(f"{m:5d} " + " ".join(f"{c:>20s}" for c in cells), flush=True)
    print("(each cell: best time per sweep, GFLOP/s)")


def fp32_body(rows: list[int], tile: int | None) -> None:
    from bulkrun.model.linear import invariant_tile, pack_panels
    from bulkrun_kernels import cpu_build

    if not cpu_build.load():
        raise SystemExit(f"no native kernels: {cpu_build.load_error()}")
    tile = tile or invariant_tile()
    g = torch.Generator().manual_seed(0)
    weights = [[torch.randn(n, k, generator=g) for n, k in SHAPES] for _ in range(LAYERS)]
    panels = [[pack_panels(w) for w in layer] for layer in weights]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in layer] for layer in weights]
    del weights
    body_flops = 2 * LAYERS * sum(n * k for n, k in SHAPES)
    print(f"fp32, {LAYERS} layers' linears; oneDNN's invariant tile: {tile} rows")
    print(f"{'rows':>5s} {'panels':>20s} {f'oneDNN, {tile}-row tiles':>24s} {'oneDNN, one call':>20s}")

    def ours(x):
        for layer in panels:
            for (n, k), w in zip(SHAPES, layer, strict=True):
                torch.ops.bulkrun_cpu.small_gemm(x[k], w, None, torch.empty(x[k].shape[0], n))

    def tiles(x):
        for layer in onednn:
            for (_, k), w in zip(SHAPES, layer, strict=True):
                padded = x[k] if x[k].shape[0] % tile == 0 else torch.nn.functional.pad(
                    x[k], (0, 0, 0, tile - x[k].shape[0] % tile))  # fmt: skip
                for i in range(0, padded.shape[0], tile):
                    torch.ops.mkldnn._linear_pointwise(padded[i : i + tile], w, None, "none", [], "")

    def theirs(x):
        onednn_sweep(onednn, x)

    for m in rows:
        x = {k: torch.randn(m, k, generator=g) for k in {k for _, k in SHAPES}}
        cells = []
        for fn, width in ((ours, 20), (tiles, 24), (theirs, 20)):
            s = best_s(fn, x)
            cells.append(f"{f'{s * 1e3:7.2f} ms {body_flops * m / s / 1e9:5.0f}':>{width}s}")
        print(f"{m:5d} " + " ".join(cells), flush=True)
    print("(each cell: best time per sweep, GFLOP/s)")


if __name__ == "__main__":
    main()
