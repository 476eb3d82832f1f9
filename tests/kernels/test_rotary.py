"""rotary: rotate-half over q and k (GQA head counts), out of place and in place, over the whole head
or its leading rotary_dim dims (partial rotary: the rest pass through)."""

from __future__ import annotations

import pytest
import torch
from kernel_refs import REF_NAMES, get_ref

from bulkrun_kernels.rotary import rotary


def cos_sin_cache(max_pos, head_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def inputs(num_tokens, hq, hkv, head_dim, dtype, device, seed, max_pos=4096, rotary_dim=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, hq, head_dim, generator=g).to(dtype)
    k = torch.randn(num_tokens, hkv, head_dim, generator=g).to(dtype)
    # Mixed positions: decode rows deep in the context next to a chunk starting at 0.
    positions = torch.cat([torch.arange(num_tokens - 3), torch.randint(0, max_pos, (3,), generator=g)])
    cache = cos_sin_cache(max_pos, rotary_dim or head_dim)
    return [t.to(device) for t in (q, k, positions, cache)]


@pytest.mark.parametrize("ref_name", REF_NAMES)
@pytest.mark.parametrize(
    ("hq", "hkv", "head_dim", "rotary_dim", "dtype", "tol"),
    [
        (4, 2, 16, 16, torch.float32, 1e-5),
        (6, 2, 24, 24, torch.float32, 1e-5),
        (8, 1, 32, 32, torch.bfloat16, 2e-2),
        (4, 2, 16, 12, torch.float32, 1e-5),  # Phi-4-mini's 0.75: a tail of 4 dims
        (6, 2, 24, 8, torch.float32, 1e-5),  # a tail longer than the rotation
        (8, 1, 128, 96, torch.bfloat16, 2e-2),  # Phi-4-mini's own head
    ],
)
def test_matches_reference(hq, hkv, head_dim, rotary_dim, dtype, tol, ref_name, device):
    q, k, positions, cache = inputs(
        9, hq, hkv, head_dim, dtype, device, seed=hq * head_dim, rotary_dim=rotary_dim
    )
    q_out, k_out = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    got_q, got_k = rotary(q, k, positions, cache, q_out=q_out, k_out=k_out)
    want_q, want_k = get_ref(ref_name).rotary(q.cpu(), k.cpu(), positions.cpu(), cache.cpu())
    assert got_q is q_out and got_k is k_out
    torch.testing.assert_close(got_q.cpu().float(), want_q.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(got_k.cpu().float(), want_k.float(), atol=tol, rtol=tol)
    # the dims past the rotation are the inputs' own, bit for bit
    assert torch.equal(got_q[..., rotary_dim:], q[..., rotary_dim:])
    assert torch.equal(got_k[..., rotary_dim:], k[..., rotary_dim:])


@pytest.mark.parametrize("rotary_dim", [16, 12])
def test_in_place_on_views_of_a_fused_projection(device, rotary_dim):
    # q and k as strided views of one qkv output, rotated in place like the model does it.
    hq, hkv, d = 4, 2, 16
    qkv = torch.randn(5, (hq + 2 * hkv) * d, device=device)
    q = qkv[:, : hq * d].view(5, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(5, hkv, d)
    v_before = qkv[:, (hq + hkv) * d :].clone()
    positions = torch.tensor([0, 1, 2, 100, 7], device=device)
    cache = cos_sin_cache(128, rotary_dim).to(device)
    want_q, want_k = get_ref("naive").rotary(q.clone(), k.clone(), positions, cache)
    got_q, got_k = rotary(q, k, positions, cache, q_out=q, k_out=k)
    torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, want_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, (hq + hkv) * d :], v_before)  # v untouched


def test_position_zero_is_identity(device):
    q, k, _, cache = inputs(4, 2, 2, 16, torch.float32, device, seed=5)
    got_q, got_k = rotary(q, k, torch.zeros(4, dtype=torch.int64, device=device), cache)
    torch.testing.assert_close(got_q, q)
    torch.testing.assert_close(got_k, k)


def test_rejects_bad_arguments(device):
    q, k, positions, cache = inputs(4, 4, 2, 16, torch.float32, device, seed=0)
    wider = torch.cat((cache, cache[:, :2]), dim=1)
    for bad in (wider, cache[:, :7]):  # more columns than head_dim, or an odd number
        with pytest.raises(ValueError, match="even number of columns, at most head_dim=16"):
            rotary(q, k, positions, bad)
    with pytest.raises(ValueError, match="disagree"):
        rotary(q, k[:3], positions, cache)
    with pytest.raises(ValueError, match="positions must have dtype"):
        rotary(q, k, positions.float(), cache)
