"""The greedy LM head on the CPU: a bf16 product screens the vocabulary, fp32 rows decide the token.

A greedy row that asks for no log-probability needs only the argmax. On CPUs with native bf16 dot
products (avx512_bf16, amx_bf16) oneDNN's bf16 product of the LM head takes about half the time of
the fp32 one (bench/lm_head_bench.py); a native pass then bounds its error and
verifies the few tokens that could still win against the fp32 weight (bulkrun_kernels.cpu_greedy),
so the token is exactly the fp32 head's argmax. Where bf16 is emulated it would be slower: not built.
"""

from __future__ import annotations

import torch

from bulkrun_kernels.cpu_dtype import native_bf16
from bulkrun_kernels.cpu_greedy import row_norms, screened_argmax

_BATCH_HINT = 64  # oneDNN's packing hint: decode steps run tens of rows


class ScreenedGreedyHead:
    def __init__(self, weight: torch.Tensor):
        self.weight = weight.detach()  # fp32 [V, K], the model's own tensor (the embedding when tied)
        self.norms = row_norms(self.weight)
        # torch's conversion rounds to nearest, as the error bound assumes
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.bfloat16(), _BATCH_HINT)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, K] final hidden rows (fp32, or a bf16 model's bf16) -> int64 [N] argmax tokens of
        h @ weight.T, the fp32 product the full head computes."""
        h = h.float()
        approx = torch.ops.mkldnn._linear_pointwise(h.bfloat16(), self.packed, None, "none", [], "")
        return screened_argmax(approx, h, self.weight, self.norms)


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
