"""The greedy LM head on the CPU: a bf16 product screens the vocabulary, fp32 rows decide the token.

A greedy row that asks for no log-probability needs only the argmax. On CPUs with native bf16 dot
products (avx512_bf16, amx_bf16) oneDNN's bf16 product of the LM head takes about half the time of
the fp32 one (7.9 vs 14.7 ms at 48 rows x 49152 x 576 here); a native pass then bounds its error and
verifies the few tokens that could still win against the fp32 weight (bulkrun_kernels.cpu_greedy),
so the token is exactly the fp32 head's argmax. Where bf16 is emulated it would be slower: not built.
"""

from __future__ import annotations

import torch

from bulkrun.model.linear import onednn_available
from bulkrun_kernels.cpu_build import cpu_flags
from bulkrun_kernels.cpu_greedy import row_norms, screened_argmax

_BATCH_HINT = 64  # oneDNN's packing hint: decode steps run tens of rows
_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


class ScreenedGreedyHead:
    def __init__(self, weight: torch.Tensor):
        self.weight = weight.detach()  # fp32 [V, K], the model's own tensor (the embedding when tied)
        self.norms = row_norms(self.weight)
        # torch's conversion rounds to nearest, as the error bound assumes
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.bfloat16(), _BATCH_HINT)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, K] fp32 final hidden rows -> int64 [N] argmax tokens of h @ weight.T."""
        approx = torch.ops.mkldnn._linear_pointwise(h.bfloat16(), self.packed, None, "none", [], "")
        return screened_argmax(approx, h, self.weight, self.norms)


def build_greedy_head(model, device: torch.device, dtype: torch.dtype, backend: str):
    """The screened head for an fp32 CPU model on the native kernels where bf16 is fast; else None.
    Call it before the Linears are packed: packing drops an untied head's plain weight."""
    if device.type != "cpu" or dtype != torch.float32 or backend != "cpu" or not native_bf16():
        return None
    weight = model.lm_head.weight
    if weight is None or model.lm_head.bias is not None:
        return None
    return ScreenedGreedyHead(weight)


def native_bf16() -> bool:
    """oneDNN runs bf16 here on native dot-product instructions (not emulated)."""
    if not (onednn_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    return not cpu_flags().isdisjoint(_NATIVE_BF16_FLAGS)
