"""A linear layer that, on the CPU, runs on weights prepacked for fast matmuls.

Batch invariant (the default): a row's output bits must not depend on how many rows share the call
(docs/batch-invariance.md), so one kernel whose per-row reduction order is fixed by K alone serves
every row count: bf16 weights run on AMX tiles or, without AMX, on AVX512-BF16 dot products
(bulkrun_kernels.cpu_gemm), fp32 ones on the panel kernel below (AVX-512 or AVX2 CPUs), and where
none is built oneDNN runs in fixed tiles of invariant_tile() rows (its blocking, which it picks from the row
count, is then always the same; each tile streams the weights again). On CUDA, the fixed-tile
Triton matmul (bulkrun_kernels.matmul) replaces cuBLAS, whose kernel choice varies with M.

Not batch invariant: two packings, chosen per call by the number of rows:
- oneDNN's blocked copy (`packed`): it beats F.linear (MKL, which takes its AVX2 path on AMD) at
  every row count on AVX-512 machines.
- for decode-sized batches, which stream every weight from DRAM (oneDNN does not overlap that with
  its FMAs): bf16 weights keep the fixed-order kernel's tiles where it is built (it prefetches the
  next panel); fp32 ones take 32-column panels for our native `small_gemm` (`panels`), which does the
  same (docs/benchmarks.md, design figures).
Keeping both costs a second copy of the linear weights; when memory is short only one stays.
The plain weight is dropped once packed (a tied LM head's weight lives on as the embedding).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psutil
import torch
import torch.nn.functional as F
from torch import nn

from bulkrun_kernels.cpu_build import cpu_flags, has_avx512
from bulkrun_kernels.cpu_gemm import (
    COLS,
    amx_packable,
    bf16_gemm,
    fixed_order_bf16_kernel,
    gated_gemm,
    gated_gemm_available,
    interleave_gate_up,
    pack_amx,
    pad_bias,
    qkv_gemm,
    qkv_gemm_available,
    rotary_qkv_blocks,
)

PANEL = 32  # columns per panel of the native small_gemm layout
SMALL_ROWS = 128  # at or below this many rows the panel kernel beats oneDNN here
# oneDNN builds (JIT-compiles) a kernel for every new row count, 1-10 ms each per weight shape, and
# a decode batch that shrinks as requests finish meets a new count nearly every step: a 48-prompt job
# paid ~1 s for it. Decode-sized inputs are padded to a multiple of ROW_BUCKET rows (free at these
# sizes: a decode step streams the weights whatever the rows); larger ones, compute-bound, are not.
ROW_BUCKET = 8
# Rows per oneDNN call where no fixed-order kernel is built (batch invariant: every call has this
# many rows, the last tile zero-padded). Each tile streams the weights again, so larger tiles suit
# prompt steps and smaller ones decode steps. On AVX2 CPUs 16 rows ran a decode-sized fp32 job 2.8x
# faster than 64 and a prompt-heavy one 8% faster (docs/benchmarks.md, A1); AVX-512 boxes keep 64.
INVARIANT_TILE_AVX512, INVARIANT_TILE_AVX2 = 64, 16


def invariant_tile() -> int:
    return INVARIANT_TILE_AVX512 if has_avx512() else INVARIANT_TILE_AVX2


def onednn_available() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def onednn_bf16_available() -> bool:
    """oneDNN packs bf16 weights here; without (AVX2 CPUs) it refuses them, and bf16 layers compute
    in fp32 on an fp32 copy (Linear.io_dtype)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def panel_kernel_available() -> bool:
    """The native panel kernel is built and has a register tile for this CPU: AVX-512 (a panel's 32
    columns, 12 rows) or AVX2 with FMA (16-column halves, 6 rows)."""
    built = hasattr(torch.ops, "bulkrun_cpu") and hasattr(torch.ops.bulkrun_cpu, "small_gemm")
    return built and (has_avx512() or {"avx2", "fma"} <= cpu_flags())


_PACKABLE = (torch.float32, torch.bfloat16)


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N / 32), K, 32]: panel p holds rows p*32.. of weight, k-major, zero-padded."""
    n, k = weight.shape
    num_panels = -(-n // PANEL)
    padded = torch.zeros(num_panels * PANEL, k, dtype=weight.dtype)
    padded[:n] = weight
    return padded.view(num_panels, PANEL, k).transpose(1, 2).contiguous()


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.packed: torch.Tensor | None = None
        self.panels: torch.Tensor | None = None
        self.panel_bias: torch.Tensor | None = None
        self.tiles: torch.Tensor | None = None  # the fixed-order bf16 GEMM's layout (cpu_gemm.pack_amx)
        self.tile_bias: torch.Tensor | None = None
        self.tile_kernel: str | None = None  # the op that runs them: "amx" or "dpbf16" (cpu_gemm)
        # a gate_up projection whose tiles are packed for the gated GEMM (fuse_gated): its activation
        self.gated: str | None = None
        # a q/k/v projection whose tiles are packed for the rotary GEMM (fuse_rotary): (num_heads,
        # num_kv_heads, head_dim)
        self.rotary_heads: tuple[int, int, int] | None = None
        self.invariant = True  # every row count takes one fixed-order kernel (set_batch_invariant)
        # where oneDNN has no bf16 path (AVX2 CPUs) a bf16 layer keeps fp32 weights and computes in
        # fp32: inputs and outputs stay in this dtype (pack_for_cpu's upcast)
        self.io_dtype: torch.dtype | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype inputs must have: the weight's, or its packed copy's once the plain one is dropped."""
        if self.io_dtype is not None:
            return self.io_dtype
        for t in (self.weight, self.packed, self.panels, self.tiles):
            if t is not None:
                return t.dtype
        raise RuntimeError("a Linear without weights")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.io_dtype is not None:
            return self._forward(x.float()).to(self.io_dtype)
        return self._forward(x)

    def on_tiles(self, rows: int) -> bool:
        """Whether a call of this many rows runs the fixed-order bf16 GEMM (its tiles)."""
        return self.tiles is not None and (self.invariant or self.packed is None or rows <= SMALL_ROWS)

    def _bf16_amx_tiles(self) -> bool:
        """Whether this layer runs on AMX tiles in bf16: what the fused GEMMs take."""
        return self.tiles is not None and self.tile_kernel == "amx" and self.io_dtype is None

    def fuse_gated(self, activation: str) -> bool:
        """Pack this gate_up projection's tiles for amx_gemm_gated, which applies the gated
        activation to its own output (the bits of the product then the activation op, without the
        product's pass through memory); True where it did: AMX tiles, each half whole column blocks.
        Its tiles then run only through gated_forward."""
        if not self._bf16_amx_tiles() or self.out_features % (2 * COLS) or not gated_gemm_available():
            return False
        self.tiles, self.tile_bias = interleave_gate_up(self.tiles), interleave_gate_up(self.tile_bias)
        self.gated = activation
        return True

    def gated_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """act(gate) * up of x where this call runs on fused tiles (fuse_gated), else None."""
        if self.gated is None or not self.on_tiles(x.shape[0]):
            return None
        return gated_gemm(x, self.tiles, self.tile_bias, self.out_features // 2, self.gated)

    def fuse_rotary(self, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """Pack this q/k/v projection's tiles for amx_gemm_qkv, which applies the rotate-half rotary
        (over whole heads) to q and k and writes k and v into the KV cache (the bits of the product,
        rotary and write_kv, without their passes over memory); True where it did: AMX tiles,
        head_dim a multiple of 32. Its tiles then run only through rotary_forward."""
        heads = (num_heads, num_kv_heads, head_dim)
        if not self._bf16_amx_tiles() or head_dim % (2 * COLS) or not qkv_gemm_available():
            return False
        if self.out_features != (num_heads + 2 * num_kv_heads) * head_dim:
            return False
        self.tiles, self.tile_bias = (
            rotary_qkv_blocks(self.tiles, *heads),
            rotary_qkv_blocks(self.tile_bias, *heads),
        )
        self.rotary_heads = heads
        return True

    def rotary_forward(
        self, x, positions, cos_sin_cache, slot_mapping, k_cache, v_cache
    ) -> torch.Tensor | None:
        """q [T, heads, head_dim], rotated, where this call runs on fused tiles (fuse_rotary), k and v
        then in the caches; else None."""
        if self.rotary_heads is None or not self.on_tiles(x.shape[0]):
            return None
        return qkv_gemm(x, self.tiles, self.tile_bias, self.rotary_heads, positions, cos_sin_cache, slot_mapping,
                        k_cache, v_cache)  # fmt: skip

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        small = x.shape[0] <= SMALL_ROWS
        if self.on_tiles(x.shape[0]):
            if self.gated is not None or self.rotary_heads is not None:
                raise RuntimeError(
                    "these tiles are packed for a fused GEMM: call gated_forward / rotary_forward"
                )
            return bf16_gemm(x, self.tiles, self.tile_bias, self.out_features, kernel=self.tile_kernel)
        if self.panels is not None and (self.packed is None or self.invariant or small):
            return self._small_gemm(x)
        if self.packed is not None:
            if self.invariant:
                return self._onednn_tiles(x)
            rows = x.shape[0]
            if small and rows % ROW_BUCKET:
                return self._onednn(_pad_rows(x, ROW_BUCKET))[:rows]
            return self._onednn(x)
        if self.invariant and x.is_cuda:
            from bulkrun_kernels.matmul import matmul

            return matmul(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def _onednn_tiles(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN on invariant_tile() rows per call, the last tile zero-padded."""
        rows, tile = x.shape[0], invariant_tile()
        padded = _pad_rows(x, tile)
        tiles = [self._onednn(padded[i : i + tile]) for i in range(0, padded.shape[0], tile)]
        return torch.cat(tiles)[:rows]

    def _small_gemm(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        torch.ops.bulkrun_cpu.small_gemm(x, self.panels, self.panel_bias, y)
        return y

    def pack_for_cpu(
        self, batch_hint: int = 64, panels: bool = False, onednn: bool = True, fixed_order: str | None = None,
        upcast: bool = False,
    ) -> None:  # fmt: skip
        """Replace the weight by the fixed-order bf16 GEMM's tiles (fixed_order: the kernel, "amx" or
        "dpbf16"; a not-invariant layer with `onednn` also keeps oneDNN's copy for large steps), or its
        oneDNN-blocked copy and/or its panel copy (fp32 only). upcast: pack an fp32 copy of a bf16
        layer, which then computes in fp32 and rounds its output to bf16."""
        weight = self.weight.detach()
        if upcast:
            self.io_dtype, weight = weight.dtype, weight.float()
            if self.bias is not None:
                self.bias = nn.Parameter(self.bias.detach().float(), requires_grad=False)
        if fixed_order:
            self.tiles, self.tile_kernel = pack_amx(weight), fixed_order
            self.tile_bias = pad_bias(self.bias, self.tiles)
            if onednn and not self.invariant:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
            self.weight = None
            return
        if panels:
            self.panels = pack_panels(weight)
            if self.bias is not None:
                self.panel_bias = torch.zeros(self.panels.shape[0] * PANEL, dtype=weight.dtype)
                self.panel_bias[: self.out_features] = self.bias.detach()
        if onednn:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.weight = None


def _pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    rows = x.shape[0]
    if rows % multiple == 0 and rows:
        return x
    padded = x.new_zeros(rows + multiple - rows % multiple, x.shape[1])
    padded[:rows] = x
    return padded


def set_batch_invariant(model: nn.Module, invariant: bool) -> None:
    """Mark every Linear of a model (on any device) invariant or not; packing reads the mark."""
    for m in model.modules():
        if isinstance(m, Linear):
            m.invariant = invariant


def pack_linears_for_cpu(model: nn.Module, panels: bool | None = None) -> bool:
    """Prepack every Linear of a CPU model (fp32 or bf16). Batch invariant Linears (the default,
    set_batch_invariant) take one fixed-order kernel each: AMX tiles or AVX512-BF16 dot products for
    bf16, panels for fp32 (the LM head included), oneDNN in fixed row tiles where those are not
    built. Otherwise oneDNN,
    and with `panels` (fp32, the native kernels loaded; default: when the model runs on the "cpu"
    kernel backend) also small_gemm; the LM head keeps oneDNN alone (its greedy rows have their own
    screen). False when oneDNN is not usable."""
    if panels is None:
        panels = getattr(getattr(model, "ops", None), "backend", None) == "cpu"
    if not onednn_available():
        return False
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if any(m.weight.device.type != "cpu" or m.weight.dtype not in _PACKABLE for m in linears):
        return False
    onednn_bf16 = onednn_bf16_available()
    native = panels
    fixed_order = fixed_order_bf16_kernel() if native else None  # AMX tiles, AVX512-BF16 dot products
    panels = native and panel_kernel_available()
    head = getattr(model, "lm_head", None)
    body_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linears if m is not head)
    # both copies only while they leave room: a second copy of a large model would not fit
    both = body_bytes * 2 < psutil.virtual_memory().available
    all_fp32 = all(m.weight.dtype == torch.float32 for m in linears)

    def pack(m: Linear) -> None:
        fp32 = m.weight.dtype == torch.float32
        if not fp32 and not onednn_bf16:  # the fp32 layers' kernels, on an fp32 copy
            with_panels = panels and m.invariant
            return m.pack_for_cpu(panels=with_panels, onednn=not with_panels, upcast=True)
        tiles = fixed_order and not fp32 and amx_packable(m.weight)
        if m.invariant:
            if tiles:
                return m.pack_for_cpu(fixed_order=fixed_order)
            with_panels = panels and fp32
            return m.pack_for_cpu(panels=with_panels, onednn=not with_panels)
        if tiles and m is not head and both:
            # decode-sized steps on the fixed-order kernel (it streams the weights faster than
            # oneDNN there, bench/linear_bench.py), larger ones on oneDNN
            return m.pack_for_cpu(fixed_order=fixed_order, onednn=True)
        # not invariant, the panels serve decode-sized calls beside oneDNN where they were measured
        # to beat it there (AVX-512); AVX2 CPUs keep oneDNN for every call
        with_panels = panels and has_avx512() and all_fp32 and m is not head
        m.pack_for_cpu(panels=with_panels, onednn=not with_panels or both)

    # one layer per thread: a oneDNN reorder runs on one core (start-up time)
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        list(pool.map(pack, linears))
    return True
