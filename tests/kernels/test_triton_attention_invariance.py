"""The Triton attention, batch invariant (the default): a query row's bits do not depend on its chunk
or batch (fixed tiles, no split-KV); with batch_invariant=False its tiles follow the step's shape."""

from __future__ import annotations

import torch
from helpers.attention_rows import three_ways

from bulkrun_kernels.paged_attention import paged_attention


def test_triton_attention_rows_are_batch_invariant(device, row_invariant_dot):
    chunk, chunks, alone = three_ways(paged_attention, torch.float32, device)
    assert torch.equal(chunk, alone) and torch.equal(chunks, alone)


def test_triton_attention_not_invariant_still_matches(device):
    chunk, chunks, alone = three_ways(paged_attention, torch.float32, device, batch_invariant=False)
    torch.testing.assert_close(chunk, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunks, alone, atol=1e-5, rtol=1e-5)


def test_the_invariance_check_has_power(device, row_invariant_dot):
    """With the step's shape choosing the tiles, the same rows come out in other bits: the check above
    can fail, even with the interpreter's dot made row invariant."""
    chunk, chunks, alone = three_ways(paged_attention, torch.float32, device, batch_invariant=False)
    assert not (torch.equal(chunk, alone) and torch.equal(chunks, alone))
