"""The CPU native small ops against the PyTorch reference: write_kv, rms_norm, rotary, silu_and_mul,
gelu_tanh_and_mul."""

from __future__ import annotations

import pytest
import torch

from bulkrun_kernels import cpu_ops, reference

G = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=G)


def test_write_kv_copies_exactly_and_skips_padding_slots():
    qkv = randn(7, 2 * 3 * 16 + 40)  # k and v are strided views into one projection, as in the model
    k = qkv[:, :48].view(7, 3, 16)
    v = qkv[:, 48:96].view(7, 3, 16)
    slots = torch.tensor([5, 70_001, -1, 0, 19, -1, 3])
    caches = [torch.full((4400, 16, 3, 16), float("nan")) for _ in range(4)]
    cpu_ops.write_kv(k, v, caches[0], caches[1], slots)
    reference.write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0].nan_to_num(7.0), caches[2].nan_to_num(7.0))
    assert torch.equal(caches[1].nan_to_num(7.0), caches[3].nan_to_num(7.0))


def test_write_kv_refuses_a_slot_past_the_cache():
    k = randn(1, 2, 16)
    cache = torch.zeros(2, 4, 2, 16)
    with pytest.raises(RuntimeError, match="slot out of range"):
        cpu_ops.write_kv(k, k, cache, cache.clone(), torch.tensor([8]))


@pytest.mark.parametrize("rows", [1, 5, 48, 1000])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(rows, with_residual):
    x, w, res = randn(rows, 96), randn(96), randn(rows, 96) if with_residual else None
    got, got_res = cpu_ops.rms_norm(x, w, 1e-6, res)
    want, want_res = reference.rms_norm(x, w, 1e-6, res)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got_res, want_res)  # the residual sum is one fp32 add either way


def test_rms_norm_writes_into_given_outputs():
    x, w, res = randn(3, 32), randn(32), randn(3, 32)
    out, res_out = torch.empty(3, 32), torch.empty(3, 32)
    got = cpu_ops.rms_norm(x, w, 1e-5, res, out=out, residual_out=res_out)
    assert got[0] is out and got[1] is res_out


@pytest.mark.parametrize("rotary_dim", [32, 24])  # the whole head, or its leading dims
@pytest.mark.parametrize("in_place", [False, True])
def test_rotary(in_place, rotary_dim):
    head_dim = 32
    qkv = randn(9, (4 + 2 + 2) * head_dim)
    q = qkv[:, : 4 * head_dim].view(9, 4, head_dim)
    k = qkv[:, 4 * head_dim : 6 * head_dim].view(9, 2, head_dim)
    positions = torch.tensor([0, 1, 2, 3, 50, 51, 700, 2, 9])
    freqs = torch.arange(1024).float()[:, None] * (1e4 ** -(torch.arange(0, rotary_dim, 2) / rotary_dim))
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    want_q, want_k = reference.rotary(q, k, positions, cache)
    outs = {"q_out": q, "k_out": k} if in_place else {}
    tails = q[..., rotary_dim:].clone(), k[..., rotary_dim:].clone()
    got_q, got_k = cpu_ops.rotary(q, k, positions, cache, **outs)
    assert torch.equal(got_q[..., rotary_dim:], tails[0]) and torch.equal(got_k[..., rotary_dim:], tails[1])
    if in_place:
        assert got_q is q and got_k is k
    torch.testing.assert_close(got_q, want_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_k, want_k, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("rows", [1, 17, 300])
def test_silu_and_mul(rows):
    x = randn(rows, 2 * 200) * 30  # large gates reach both tails of silu
    torch.testing.assert_close(cpu_ops.silu_and_mul(x), reference.silu_and_mul(x), atol=1e-5, rtol=1e-5)
    out = torch.empty(rows, 200)
    assert cpu_ops.silu_and_mul(x, out=out) is out


@pytest.mark.parametrize("rows", [1, 17, 300])
def test_gelu_tanh_and_mul(rows):
    x = randn(rows, 2 * 200) * 6  # both tails of the tanh, and gates near 0
    # against float64: torch's fp32 0.5 g (1 + tanh) cancels in the negative tail, ours does not
    want = reference.gelu_tanh_and_mul(x.double()).float()
    torch.testing.assert_close(cpu_ops.gelu_tanh_and_mul(x), want, atol=1e-6, rtol=1e-5)
    out = torch.empty(rows, 200)
    assert cpu_ops.gelu_tanh_and_mul(x, out=out) is out


def test_float16_goes_to_the_reference():
    x, w = randn(4, 32).half(), randn(32).half()
    assert torch.equal(cpu_ops.rms_norm(x, w, 1e-6)[0], reference.rms_norm(x, w, 1e-6)[0])
    assert torch.equal(cpu_ops.silu_and_mul(x), reference.silu_and_mul(x))
