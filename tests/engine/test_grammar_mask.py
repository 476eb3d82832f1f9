"""Packed token bitmasks applied to logits rows (grammar_mask.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bulkrun.engine.structured_output.bitmask import apply_token_bitmask, unpack_bitmask


def pack(allowed: list[set[int]], vocab: int) -> torch.Tensor:
    """The reference packing: bit t % 32 of word t // 32."""
    bits = np.zeros((len(allowed), -(-vocab // 32) * 32), dtype=np.uint8)
    for row, tokens in enumerate(allowed):
        bits[row, sorted(tokens)] = 1
    return torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view(np.int32).copy())


@pytest.mark.parametrize("vocab", [49152, 100, 33])  # whole words, and a last word only partly used
def test_unpack_is_the_inverse_of_packing(vocab):
    allowed = [{0, 31, 32, vocab - 1}, set(range(0, vocab, 7)), set()]
    got = unpack_bitmask(pack(allowed, vocab), vocab)
    assert got.shape == (3, vocab)
    for row, tokens in enumerate(allowed):
        assert set(torch.nonzero(got[row]).flatten().tolist()) == tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_disallowed_logits_become_minus_inf_and_the_rest_are_untouched(dtype):
    vocab = 1000
    logits = torch.randn(2, vocab).to(dtype)
    before = logits.clone()
    allowed = [{5, 17, 999}, set(range(500))]
    apply_token_bitmask(logits, pack(allowed, vocab))
    for row, tokens in enumerate(allowed):
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[list(tokens)] = True
        assert torch.equal(logits[row, keep], before[row, keep])
        assert torch.isneginf(logits[row, ~keep]).all()
    assert logits[0].argmax().item() in allowed[0]


def test_only_the_named_rows_are_masked():
    vocab = 64
    logits = torch.randn(4, vocab)
    before = logits.clone()
    apply_token_bitmask(logits, pack([{3}, {60}], vocab), rows=[2, 0])
    assert logits[2].argmax().item() == 3 and logits[0].argmax().item() == 60
    assert torch.equal(logits[[1, 3]], before[[1, 3]])


def test_a_mask_row_with_everything_allowed_changes_nothing():
    logits = torch.randn(1, 70)
    before = logits.clone()
    apply_token_bitmask(logits, torch.full((1, 3), -1, dtype=torch.int32))
    assert torch.equal(logits, before)


@pytest.mark.parametrize(
    "mask, message",
    [
        (torch.zeros(2, 4, dtype=torch.int64), "2-D int32"),
        (torch.zeros(2, 1, dtype=torch.int32), "cannot cover a vocabulary of 64"),
        (torch.zeros(1, 2, dtype=torch.int32), "1 rows for 2 logits rows"),
    ],
)
def test_wrong_masks_are_refused(mask, message):
    with pytest.raises(ValueError, match=message):
        apply_token_bitmask(torch.zeros(2, 64), mask)
