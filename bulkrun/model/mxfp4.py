"""MXFP4 expert weights (gpt-oss's published checkpoints), de-quantized on load as transformers does.

A checkpoint whose config.json says `quantization_config: {"quant_method": "mxfp4"}` stores each
expert projection P of a layer (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) as two uint8
tensors instead of P itself:

    P_blocks [E, rows, cols / 32, 16]   two e2m1 (FP4) codes per byte, the low nibble first
    P_scales [E, rows, cols / 32]       one e8m0 exponent per 32 values: a factor 2 ** (s - 127)

with (rows, cols) = (2I, H) for gate_up_proj and (H, I) for down_proj. Everything else (expert
biases, router, attention, embeddings: the config's `modules_to_not_convert`) is stored unquantized
and loads as it is; so does a projection stored unquantized. De-quantizing is transformers'
`convert_moe_packed_tensors`: the code's FP4 value in the model dtype, `torch.ldexp` by the exponent,
giving transformers' parameter [E, cols, rows] (x @ W), which the loader then brings to our layout.
It runs on the CPU, one projection of one layer at a time; the model runs the de-quantized
weights (there is no packed FP4 kernel).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# the e2m1 value of each 4-bit code (bit 3: sign), transformers' FP4_VALUES
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_PROJECTIONS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_E8M0_BIAS = 127


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[E, rows, G, 16] packed codes and [E, rows, G] exponents -> [E, G * 32, rows] in `dtype`
    (a transposed view), equal to transformers' convert_moe_packed_tensors."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, not {blocks.dtype} and {scales.dtype}")
    if blocks.dim() != 4 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)} "
            "(expected [E, rows, groups, 16] and [E, rows, groups])"
        )
    experts, rows, groups, width = blocks.shape
    lut = torch.tensor(FP4_VALUES, dtype=dtype)
    out = torch.empty(experts, rows, groups, 2 * width, dtype=dtype)
    for e in range(experts):  # one expert's temporaries at a time (index and fp32 ldexp copies)
        sub = out[e]
        sub[..., 0::2] = lut[(blocks[e] & 0x0F).int()]
        sub[..., 1::2] = lut[(blocks[e] >> 4).int()]
        torch.ldexp(sub, scales[e].to(torch.int32).unsqueeze(-1) - _E8M0_BIAS, out=sub)
    return out.view(experts, rows, groups * 2 * width).transpose(1, 2)


def dequantizing(tensors: dict[str, Callable[[], torch.Tensor]], dtype: torch.dtype) -> dict:
    """A checkpoint's name -> loader map in which each expert projection stored as P_blocks and
    P_scales is P, de-quantized to `dtype` when it is loaded."""
    out = dict(tensors)
    for name in tensors:
        base = name.removesuffix("_blocks")
        if base == name or not base.endswith(_PROJECTIONS):
            continue
        scales = f"{base}_scales"
        if scales not in tensors:
            raise ValueError(f"MXFP4 checkpoint has {name} but not {scales}")
        if base in tensors:
            raise ValueError(f"MXFP4 checkpoint has both {base} and its quantized form {name}")
        del out[name], out[scales]
        out[base] = lambda b=tensors[name], s=tensors[scales]: dequantize(b(), s(), dtype)
    return out
