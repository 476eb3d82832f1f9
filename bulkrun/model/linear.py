"""A linear layer that, on the CPU, runs on weights prepacked for fast fp32 matmuls.

Two packings, chosen per call by the number of rows:
- oneDNN's blocked copy (`packed`): measured here (AMD EPYC, AVX-512) it beats F.linear (MKL, which
  takes its AVX2 path on AMD) at every row count, and reaches ~215 GFLOP/s on prompt chunks.
- 32-column panels for our native `small_gemm` (`panels`, only with the CPU native kernels): at
  decode-sized batches a step streams every weight from DRAM, which oneDNN does not overlap with its
  FMAs; the panel kernel prefetches the next panel and runs a 30-layer decode step of 48 rows in ~51
  ms against oneDNN's ~70 (both measured on the default model's shapes).
Keeping both costs a second copy of the linear weights; when memory is short only the panels stay.
The plain weight is dropped once packed (a tied LM head's weight lives on as the embedding).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psutil
import torch
import torch.nn.functional as F
from torch import nn

PANEL = 32  # columns per panel of the native small_gemm layout
SMALL_ROWS = 128  # at or below this many rows the panel kernel beats oneDNN here
# oneDNN builds (JIT-compiles) a kernel for every new row count, 1-10 ms each per weight shape, and
# a decode batch that shrinks as requests finish meets a new count nearly every step: a 48-prompt job
# paid ~1 s for it. Decode-sized inputs are padded to a multiple of ROW_BUCKET rows (free at these
# sizes: a decode step streams the weights whatever the rows); larger ones, compute-bound, are not.
ROW_BUCKET = 8


def onednn_available() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def panel_kernel_available() -> bool:
    return hasattr(torch.ops, "bulkrun_cpu") and hasattr(torch.ops.bulkrun_cpu, "small_gemm")


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

    @property
    def dtype(self) -> torch.dtype:
        """The dtype inputs must have: the weight's, or its packed copy's once the plain one is dropped."""
        for t in (self.weight, self.packed, self.panels):
            if t is not None:
                return t.dtype
        raise RuntimeError("a Linear without weights")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.panels is not None and (self.packed is None or x.shape[0] <= SMALL_ROWS):
            return self._small_gemm(x)
        if self.packed is not None:
            rows = x.shape[0]
            if rows <= SMALL_ROWS and rows % ROW_BUCKET:
                padded = x.new_zeros(rows + ROW_BUCKET - rows % ROW_BUCKET, x.shape[1])
                padded[:rows] = x
                return torch.ops.mkldnn._linear_pointwise(padded, self.packed, self.bias, "none", [], "")[
                    :rows
                ]
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def _small_gemm(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        torch.ops.bulkrun_cpu.small_gemm(x, self.panels, self.panel_bias, y)
        return y

    def pack_for_cpu(self, batch_hint: int = 64, panels: bool = False, onednn: bool = True) -> None:
        """Replace the weight by its oneDNN-blocked copy and/or its panel copy (fp32 only)."""
        weight = self.weight.detach()
        if panels:
            self.panels = pack_panels(weight)
            if self.bias is not None:
                self.panel_bias = torch.zeros(self.panels.shape[0] * PANEL, dtype=weight.dtype)
                self.panel_bias[: self.out_features] = self.bias.detach()
        if onednn:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.weight = None


def pack_linears_for_cpu(model: nn.Module, panels: bool | None = None) -> bool:
    """Prepack every Linear of a CPU model (fp32 or bf16) for oneDNN, and with `panels` (fp32, the
    native kernels loaded; default: when the model runs on the "cpu" kernel backend) also for
    small_gemm; the LM head keeps oneDNN alone (its greedy rows have their own screen). False when
    oneDNN is not usable."""
    if panels is None:
        panels = getattr(getattr(model, "ops", None), "backend", None) == "cpu"
    if not onednn_available():
        return False
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if any(m.weight.device.type != "cpu" or m.weight.dtype not in _PACKABLE for m in linears):
        return False
    panels = panels and panel_kernel_available() and all(m.weight.dtype == torch.float32 for m in linears)
    head = getattr(model, "lm_head", None)
    body_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linears if m is not head)
    # both copies only while they leave room: a second copy of a large model would not fit
    both = body_bytes * 2 < psutil.virtual_memory().available

    def pack(m: Linear) -> None:
        with_panels = panels and m is not head
        m.pack_for_cpu(panels=with_panels, onednn=not with_panels or both)

    # one layer per thread: a oneDNN reorder runs on one core (start-up time)
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        list(pool.map(pack, linears))
    return True
