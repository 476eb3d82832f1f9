"""The greedy LM head on the CPU: a bf16 or int8 product screens the vocabulary, fp32 rows decide the token.

A greedy row that asks for no log-probability needs only the argmax. On CPUs with native bf16 dot
products (avx512_bf16, amx_bf16) a bf16 product of the LM head (oneDNN's; without AMX, our
AVX512-BF16 GEMM's) takes about half the time of the fp32 one (bench/lm_head_bench.py); where AMX
runs int8 tiles, an int8 product reads half the bf16 bytes again at twice the tile rate
(kernels/cpu/head_int8.h); elsewhere an int8 product on AVX512-VNNI dot products, twice the bf16
products an instruction, with the rows' outlier dimensions in fp32 (kernels/cpu/head_vnni.h).
A native pass then bounds the
screen's error and verifies the few tokens that could still win against the fp32 weight
(bulkrun_kernels.cpu_greedy), so the token is exactly the fp32 head's argmax. Where bf16 is emulated
it would be slower: not built.
"""

from __future__ import annotations

import torch

from bulkrun_kernels.cpu_dtype import native_bf16
from bulkrun_kernels.cpu_gemm import amx_packable, bf16_gemm, fixed_order_bf16_kernel, pack_amx
from bulkrun_kernels.cpu_greedy import (
    Int8Head,
    VnniHead,
    int8_screen_available,
    row_norms,
    screened_argmax,
    screened_argmax_int8,
    screened_argmax_vnni,
    vnni_screen_available,
)

_BATCH_HINT = 64  # oneDNN's packing hint: decode steps run tens of rows
# Up to this many rows the int8 screen wins (it reads half the bytes); above, the product is bound by
# the tiles, and the int8 screen's two-part rows (hi, lo: head_int8.h) make as much tile work as bf16's.
# bench/lm_head_bench.py --rows N, AMX box, head cold: 48 rows 3.4 against 4.4 ms, 128 rows 7.2
# against 8.7 ms, 160 rows 9.3 against 8.2 ms.
_INT8_MAX_ROWS = 128


class ScreenedGreedyHead:
    def __init__(self, weight: torch.Tensor, int8: bool | None = None):
        """int8: screen in int8 (None: where it runs here): on AMX tiles where the CPU has them, else
        on AVX512-VNNI; False: the bf16 screen."""
        self.weight = weight.detach()  # fp32 [V, K], the model's own tensor (the embedding when tied)
        self.norms = row_norms(self.weight)
        amx_int8 = int8_screen_available()
        if int8 is None:
            int8 = amx_int8 or vnni_screen_available()
        self.int8 = Int8Head(self.weight) if int8 and amx_int8 else None
        # without AMX: at every row count (48 rows, Zen 5: 2.5-2.8 against 3.1-3.3 ms for the bf16
        # screen; 256 rows 12.0-12.5 against 17.1-17.4; bench/lm_head_bench.py)
        self.vnni = VnniHead(self.weight) if int8 and not amx_int8 else None
        # torch's conversion rounds to nearest, as the error bound assumes. Without AMX the bf16
        # screen runs on our AVX512-BF16 GEMM: at decode row counts it beats oneDNN's (48 rows, Zen 5:
        # 2.9-3.1 against 3.6-3.8 ms, bench/lm_head_bench.py), and the bound holds for any fp32 sum order.
        self.dpbf16 = fixed_order_bf16_kernel() == "dpbf16" and amx_packable(self.weight)
        self.packed = None  # the bf16 screen's copy of the head: the VNNI screen takes every row without it
        if self.vnni is None:
            bf16 = self.weight.bfloat16()
            self.packed = (
                pack_amx(bf16) if self.dpbf16 else torch.ops.mkldnn._reorder_linear_weight(bf16, _BATCH_HINT)
            )

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, K] final hidden rows (fp32, or a bf16 model's bf16) -> int64 [N] argmax tokens of
        h @ weight.T, the fp32 product the full head computes."""
        h = h.float()
        if self.vnni is not None:
            return screened_argmax_vnni(h, self.vnni, self.weight, self.norms)
        if self.int8 is not None and h.shape[0] <= _INT8_MAX_ROWS:
            return screened_argmax_int8(h, self.int8, self.weight, self.norms)
        return screened_argmax(self.screen(h), h, self.weight, self.norms)

    def screen(self, h: torch.Tensor) -> torch.Tensor:
        """The bf16 screen of fp32 rows h: bf16(h) @ bf16(weight).T, summed in fp32, rounded to bf16
        (a head built with int8=False)."""
        if self.packed is None:
            raise RuntimeError("this head screens in int8: build it with int8=False for the bf16 screen")
        if self.dpbf16:
            return bf16_gemm(h.bfloat16(), self.packed, None, self.weight.shape[0], kernel="dpbf16")
        return torch.ops.mkldnn._linear_pointwise(h.bfloat16(), self.packed, None, "none", [], "")


def build_greedy_head(model, device: torch.device, dtype: torch.dtype, backend: str):
    """The screened head for a CPU model with an fp32 LM head (an fp32 model's, or a bf16 model's,
    whose head the loader keeps in fp32) on the native kernels where bf16 is fast; else None.
    Call it before the Linears are packed: packing drops an untied head's plain weight."""
    if device.type != "cpu" or backend != "cpu" or not native_bf16():
        return None
    weight = model.lm_head.weight
    if weight is None or weight.dtype != torch.float32 or model.lm_head.bias is not None:
        return None
    return ScreenedGreedyHead(weight)
