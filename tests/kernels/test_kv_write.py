"""write_kv: rows land exactly at their slots (incl. a block id past 2**16 slots); nothing else changes."""

from __future__ import annotations

import pytest
import torch
from kernel_refs import REF_NAMES, get_ref

from bulkrun_kernels.kv_write import write_kv


def make_inputs(num_tokens, num_heads, head_dim, block_size, num_blocks, *, seed, dtype, device):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_tokens, num_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(num_tokens, num_heads, head_dim, generator=g).to(dtype)
    # Distinct random slots, the very last slot of the pool among them, one padding row (-1).
    slots = torch.randperm(num_blocks * block_size - 1, generator=g)[:num_tokens]
    slots[0] = num_blocks * block_size - 1
    slots[num_tokens // 2] = -1
    cache = torch.full((num_blocks, block_size, num_heads, head_dim), float("nan"), dtype=dtype)
    return [t.to(device) for t in (k, v, cache, cache.clone(), slots.long())]


CASES = {
    # name: (num_tokens, num_heads, head_dim, block_size, num_blocks, dtype)
    "small": (9, 2, 16, 4, 16, torch.float32),
    "odd_heads_dim": (7, 3, 24, 16, 8, torch.float32),  # padded heads and head_dim
    "large_block_index": (12, 1, 8, 4, 70_000, torch.float32),  # block ids past 2**16, 280,000 slots
    "bf16": (10, 4, 16, 8, 32, torch.bfloat16),
}


@pytest.mark.parametrize("ref_name", REF_NAMES)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, ref_name, device):
    num_tokens, heads, dim, block_size, num_blocks, dtype = CASES[case]
    k, v, k_cache, v_cache, slots = make_inputs(
        num_tokens, heads, dim, block_size, num_blocks, seed=len(case), dtype=dtype, device=device
    )
    write_kv(k, v, k_cache, v_cache, slots)
    want_k = torch.full(k_cache.shape, float("nan"), dtype=dtype)
    want_v = want_k.clone()
    get_ref(ref_name).write_kv(k.cpu(), v.cpu(), want_k, want_v, slots.cpu())
    # equal_nan: every slot not written must still hold its poison
    torch.testing.assert_close(k_cache.cpu(), want_k, equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(v_cache.cpu(), want_v, equal_nan=True, atol=0, rtol=0)
    written = int((~torch.isnan(k_cache.cpu().flatten(0, 1)[:, 0, 0])).sum())
    assert written == num_tokens - 1  # all but the padding row


def test_strided_inputs(device):
    # k and v as views into one fused projection output, as the model produces them.
    kv = torch.randn(5, 2, 2, 16, device=device)
    k, v = kv[:, 0], kv[:, 1]
    cache = torch.zeros(4, 4, 2, 16, device=device)
    v_cache = torch.zeros_like(cache)
    slots = torch.tensor([3, 0, 15, 9, 4], device=device)
    write_kv(k, v, cache, v_cache, slots)
    flat_k, flat_v = cache.flatten(0, 1), v_cache.flatten(0, 1)
    assert torch.equal(flat_k[slots], k) and torch.equal(flat_v[slots], v)


def test_rejects_bad_arguments(device):
    k, v, k_cache, v_cache, slots = make_inputs(4, 2, 16, 4, 8, seed=0, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="slot_mapping has 3 slots for 4 tokens"):
        write_kv(k, v, k_cache, v_cache, slots[:3])
    with pytest.raises(ValueError, match="differ from the cache"):
        write_kv(k[:, :1], v[:, :1], k_cache, v_cache, slots)
    with pytest.raises(ValueError, match="slot_mapping must have dtype"):
        write_kv(k, v, k_cache, v_cache, slots.float())
