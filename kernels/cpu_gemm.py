"""bf16 linears with a per-row reduction order fixed by K alone: on AMX tiles (kernels/cpu/amx_gemm.cpp)
or, on CPUs without AMX, on AVX512-BF16 dot products (kernels/cpu/dpbf16_gemm.cpp); one weight layout.

    wp = pack_amx(weight)                      # once per weight: [N, K] -> [ceil(N/16), K/32, 16, 32]
    y = bf16_gemm(x, wp, bias, out_features)   # x [M, K] bf16 -> [M, N] bf16 (or out_dtype)

On AMX, two projections with an op in the GEMM's epilogue (the bits of the GEMM, then the op):

    act = gated_gemm(x, interleave_gate_up(wp), interleave_gate_up(bias), n // 2, "silu")  # gate_up
    q = qkv_gemm(x, rotary_qkv_blocks(wp, *heads), rotary_qkv_blocks(bias, *heads), heads,
                 positions, cos_sin_cache, slot_mapping, k_cache, v_cache)  # q/k/v, rotary, KV write

A row's output bits do not depend on M or on the other rows (the batch-invariance contract). The
two kernels round alike but sum in their own order: a machine runs one of them, always the same.
"""

from __future__ import annotations

import functools

import torch

COLS, STEP = 16, 32  # columns per tile, K per tile instruction


def amx_available() -> bool:
    ops = getattr(torch.ops, "bulkrun_cpu", None)
    return ops is not None and hasattr(ops, "amx_gemm") and bool(ops.amx_gemm_available())


def dpbf16_available() -> bool:
    ops = getattr(torch.ops, "bulkrun_cpu", None)
    return ops is not None and hasattr(ops, "dpbf16_gemm") and bool(ops.dpbf16_gemm_available())


def gated_gemm_available() -> bool:
    """Whether amx_gemm_gated (a gate_up projection with its gated activation) runs here."""
    return amx_available() and hasattr(torch.ops.bulkrun_cpu, "amx_gemm_gated")


def qkv_gemm_available() -> bool:
    """Whether amx_gemm_qkv (a q/k/v projection with rotary and the KV write) runs here."""
    return amx_available() and hasattr(torch.ops.bulkrun_cpu, "amx_gemm_qkv")


def fixed_order_bf16_kernel() -> str | None:
    """The fixed-order bf16 GEMM this CPU runs: "amx", "dpbf16" (AVX512-BF16), or None."""
    if amx_available():
        return "amx"
    return "dpbf16" if dpbf16_available() else None


def amx_packable(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.shape[1] % STEP == 0


def pack_amx(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> bf16 [NB, K/32, 16, 32]: tile (nb, s) holds W[16 nb + c][32 s + 2 i + j] at [i][2 c + j]."""
    n, k = weight.shape
    if k % STEP:
        raise ValueError(f"amx_gemm needs K a multiple of {STEP}, got {k}")
    blocks = -(-n // COLS)
    padded = torch.zeros(blocks * COLS, k, dtype=torch.bfloat16)
    padded[:n] = weight
    tiles = padded.view(blocks, COLS, k // STEP, STEP // 2, 2).permute(0, 2, 3, 1, 4)
    return tiles.reshape(blocks, k // STEP, STEP // 2, 2 * COLS).contiguous()


def _block_count(packed: torch.Tensor) -> int:
    """Column blocks of pack_amx's tiles (dim 0) or of pad_bias's bias ([NB * 16])."""
    return packed.numel() // COLS if packed.dim() == 1 else packed.shape[0]


def _reorder_blocks(packed: torch.Tensor | None, order: list[int]) -> torch.Tensor | None:
    """Tiles or padded bias with their column blocks in `order` (None stays None)."""
    if packed is None:
        return None
    blocks = packed.reshape(-1, COLS) if packed.dim() == 1 else packed
    return blocks[order].contiguous().reshape(packed.shape)


def interleave_gate_up(packed: torch.Tensor | None) -> torch.Tensor | None:
    """A gate_up projection's column blocks (pack_amx's tiles, or pad_bias's bias) from all gate
    blocks, then all up blocks, to gate 0, up 0, gate 1, up 1, ...: amx_gemm_gated's layout. The gate
    half must be whole blocks (intermediate size a multiple of 16)."""
    if packed is None:
        return None
    count = _block_count(packed)
    if count % 2:
        raise ValueError("gate_up's halves must be whole column blocks of 16")
    half = count // 2
    return _reorder_blocks(packed, [b for j in range(half) for b in (j, half + j)])


def rotary_qkv_blocks(
    packed: torch.Tensor | None, num_heads: int, num_kv_heads: int, head_dim: int
) -> torch.Tensor | None:
    """A q/k/v projection's column blocks (as interleave_gate_up takes them) with each q and k head's
    reordered for amx_gemm_qkv: the block of dims 16j.., then that of head_dim / 2 + 16j.., for
    j = 0 .. head_dim / 32 - 1, so each pair of blocks holds what a rotate-half rotation mixes; the v
    blocks as they are. head_dim must be a multiple of 32."""
    if packed is None:
        return None
    if head_dim % (2 * COLS):
        raise ValueError(f"the rotary q/k/v layout needs head_dim a multiple of {2 * COLS}, got {head_dim}")
    per_head, rotated, count = head_dim // COLS, num_heads + num_kv_heads, _block_count(packed)
    if count != (rotated + num_kv_heads) * per_head:
        raise ValueError("the weight is not q | k | v heads of head_dim columns")
    half = per_head // 2
    within = [b for j in range(half) for b in (j, half + j)]  # one head's blocks, in the new order
    order = [h * per_head + b for h in range(rotated) for b in within]
    return _reorder_blocks(packed, order + list(range(rotated * per_head, count)))


def pad_bias(bias: torch.Tensor | None, wp: torch.Tensor) -> torch.Tensor | None:
    """fp32 bias padded to wp's column blocks (what amx_gemm reads), or None."""
    if bias is None:
        return None
    padded = torch.zeros(wp.shape[0] * COLS, dtype=torch.float32)
    padded[: bias.numel()] = bias.float()
    return padded


def bf16_gemm(
    x: torch.Tensor,
    wp: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
    out_dtype: torch.dtype = torch.bfloat16,
    kernel: str | None = None,
) -> torch.Tensor:
    """kernel: "amx" or "dpbf16" (default: the one this CPU runs)."""
    if x.dtype != torch.bfloat16:
        raise TypeError(f"bf16_gemm takes bfloat16 input, got {x.dtype}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(x.shape[0], out_features, dtype=out_dtype)
    _gemm_op(kernel or fixed_order_bf16_kernel())(x, wp, bias, y)
    return y


def gated_gemm(
    x: torch.Tensor, wp: torch.Tensor, bias: torch.Tensor | None, out_features: int, activation: str
) -> torch.Tensor:
    """act(gate) * up [M, out_features] of x times interleave_gate_up's tiles (amx_gemm_gated): the
    bits of bf16_gemm then silu_and_mul / gelu_tanh_and_mul."""
    if x.dtype != torch.bfloat16:
        raise TypeError(f"gated_gemm takes bfloat16 input, got {x.dtype}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(x.shape[0], out_features, dtype=torch.bfloat16)
    torch.ops.bulkrun_cpu.amx_gemm_gated.default(x, wp, bias, activation, y)
    return y


def qkv_gemm(x: torch.Tensor, wp: torch.Tensor, bias: torch.Tensor | None, heads: tuple[int, int, int],
             positions: torch.Tensor, cos_sin_cache: torch.Tensor, slot_mapping: torch.Tensor,
             k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """q [M, num_heads, head_dim], rotated, of x times rotary_qkv_blocks' tiles (amx_gemm_qkv); k,
    rotated, and v written to the caches at slot_mapping (rows < 0: not written). heads: (num_heads,
    num_kv_heads, head_dim). The bits of bf16_gemm, rotary and write_kv."""
    if x.dtype != torch.bfloat16:
        raise TypeError(f"qkv_gemm takes bfloat16 input, got {x.dtype}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    num_heads, num_kv_heads, head_dim = heads
    q = torch.empty(x.shape[0], num_heads, head_dim, dtype=torch.bfloat16)
    torch.ops.bulkrun_cpu.amx_gemm_qkv.default(
        x, wp, bias, num_heads, num_kv_heads, head_dim, positions.long().contiguous(), cos_sin_cache.contiguous(),
        slot_mapping.long().contiguous(), q, k_cache, v_cache,
    )  # fmt: skip
    return q


@functools.cache
def _gemm_op(kernel: str):
    """The kernel's op overload, looked up once: a decode step makes ~120 of these calls."""
    return getattr(torch.ops.bulkrun_cpu, f"{kernel}_gemm").default
