"""The torch side of constrained decoding: a packed token bitmask applied to rows of a logits tensor.

The grammar engine (grammar.py) fills one int32 row of ceil(V/32) words per constrained request,
bit `t % 32` of word `t // 32` set when token t is allowed. Here those rows become -inf on the
disallowed logits, before sampling, for greedy and sampled rows alike. Plain tensor ops (shift, and,
masked_fill), so it runs as-is on the CPU and on CUDA; llguidance's own helper is torch.compile'd,
which costs seconds of compilation on the first call on the CPU.
"""

from __future__ import annotations

import torch

_BITS: dict[torch.device, torch.Tensor] = {}


def _bit_positions(device: torch.device) -> torch.Tensor:
    if device not in _BITS:
        _BITS[device] = torch.arange(32, dtype=torch.int32, device=device)
    return _BITS[device]


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, W] int32 packed -> [R, vocab] bool, True where the token is allowed."""
    bits = (bitmask.unsqueeze(-1) >> _bit_positions(bitmask.device)) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | torch.Tensor | None = None
) -> None:
    """Set disallowed logits to -inf in place.

    logits [N, V] (any float dtype, any device); bitmask [R, ceil(V/32)] int32 (any device: moved to
    the logits' one); rows: which logits rows the R mask rows belong to (None: all N, in order), so a
    batch that mixes constrained and free rows masks only the constrained ones.
    """
    n, vocab = logits.shape
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(f"bitmask must be a 2-D int32 tensor, got {bitmask.dtype} {tuple(bitmask.shape)}")
    if bitmask.shape[1] * 32 < vocab:
        raise ValueError(f"bitmask of {bitmask.shape[1]} words cannot cover a vocabulary of {vocab}")
    count = n if rows is None else len(rows)
    if bitmask.shape[0] < count:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {count} logits rows")
    bitmask = bitmask[:count]
    if bitmask.device != logits.device:
        bitmask = bitmask.to(logits.device)
    allowed = unpack_bitmask(bitmask, vocab)
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
        return
    index = (
        rows if isinstance(rows, torch.Tensor) else torch.tensor(rows, dtype=torch.long, device=logits.device)
    )
    logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(~allowed, float("-inf")))
