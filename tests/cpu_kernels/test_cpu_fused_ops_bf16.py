"""The CPU native fused ops on bfloat16 tensors against the float32 references run on the same (bf16)
values, for the row shapes the float32 tests cover (attention over a bf16 cache: test_cpu_attention). The native code computes in float32 and rounds each output once, so
it sits within one bf16 rounding of the float32 reference."""

from __future__ import annotations

import pytest
import torch

from bulkrun_kernels import cpu_ops, reference

BF16 = torch.bfloat16
# one bf16 rounding of the output (2^-8 relative) plus the float32 sums' differences
ATOL, RTOL = 1e-2, 8e-3
G = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=G)


def test_write_kv_copies_bf16_rows_exactly():
    qkv = randn(6, 2 * 2 * 32 + 16).to(BF16)
    k, v = qkv[:, :64].view(6, 2, 32), qkv[:, 64:128].view(6, 2, 32)
    slots = torch.tensor([3, -1, 0, 70, 5, 1])
    caches = [torch.zeros(10, 8, 2, 32, dtype=BF16) for _ in range(4)]
    cpu_ops.write_kv(k, v, caches[0], caches[1], slots)
    reference.write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def _close_to_fp32(got, want):
    assert got.dtype == BF16
    torch.testing.assert_close(got.float(), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("rows", [1, 5, 48, 1000])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(rows, with_residual):
    x, w = randn(rows, 96).to(BF16), randn(96).to(BF16)
    res = randn(rows, 96).to(BF16) if with_residual else None
    got, got_res = cpu_ops.rms_norm(x, w, 1e-6, res)
    summed = x.float() + res.float() if with_residual else x.float()
    # the reference normalises the bf16 sum, as the native op does
    want = reference.rms_norm(summed.to(BF16).float(), w.float(), 1e-6)[0]
    _close_to_fp32(got, want)
    assert torch.equal(got_res, summed.to(BF16))  # one rounding of the float32 sum


def test_rms_norm_keeps_a_float32_residual_stream():
    x, w, res = randn(7, 64).to(BF16), randn(64), randn(7, 64)
    out, res_out = torch.empty(7, 64, dtype=BF16), torch.empty(7, 64)
    got, got_res = cpu_ops.rms_norm(x, w, 1e-5, res, out=out, residual_out=res_out)
    assert got is out and got_res is res_out
    summed = x.float() + res
    assert torch.equal(got_res, summed)
    _close_to_fp32(got, reference.rms_norm(summed, w, 1e-5)[0])
    first, first_res = cpu_ops.rms_norm(res, w.to(BF16), 1e-5, out=torch.empty(7, 64, dtype=BF16))
    assert first_res is res  # no residual yet: the float32 input is the stream


@pytest.mark.parametrize("cache_dtype", [torch.float32, BF16])
@pytest.mark.parametrize("rotary_dim", [64, 48])  # the whole head, or its leading dims
@pytest.mark.parametrize("in_place", [False, True])
def test_rotary(cache_dtype, in_place, rotary_dim):
    head_dim = 64
    qkv = randn(9, (4 + 2 + 2) * head_dim).to(BF16)
    q = qkv[:, : 4 * head_dim].view(9, 4, head_dim)
    k = qkv[:, 4 * head_dim : 6 * head_dim].view(9, 2, head_dim)
    positions = torch.tensor([0, 1, 2, 3, 50, 51, 700, 2, 9])
    freqs = torch.arange(1024).float()[:, None] * (1e4 ** -(torch.arange(0, rotary_dim, 2) / rotary_dim))
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(cache_dtype)
    want_q, want_k = reference.rotary(q.float(), k.float(), positions, cache.float())
    outs = {"q_out": q, "k_out": k} if in_place else {}
    tails = q[..., rotary_dim:].clone(), k[..., rotary_dim:].clone()
    got_q, got_k = cpu_ops.rotary(q, k, positions, cache, **outs)
    assert torch.equal(got_q[..., rotary_dim:], tails[0]) and torch.equal(got_k[..., rotary_dim:], tails[1])
    if in_place:
        assert got_q is q and got_k is k
    _close_to_fp32(got_q, want_q)
    _close_to_fp32(got_k, want_k)


@pytest.mark.parametrize("rows", [1, 17, 300])
def test_silu_and_mul(rows):
    x = (randn(rows, 2 * 200) * 30).to(BF16)
    _close_to_fp32(cpu_ops.silu_and_mul(x), reference.silu_and_mul(x.float()))
    out = torch.empty(rows, 200, dtype=BF16)
    assert cpu_ops.silu_and_mul(x, out=out) is out


@pytest.mark.parametrize("rows", [1, 17, 300])
def test_gelu_tanh_and_mul(rows):
    x = (randn(rows, 2 * 200) * 6).to(BF16)
    _close_to_fp32(cpu_ops.gelu_tanh_and_mul(x), reference.gelu_tanh_and_mul(x.float()))


@pytest.mark.parametrize("rows", [1, 17])
def test_subnormal_outputs_are_kept_not_flushed(rows):
    """bf16 outputs go through the AVX512-BF16 conversion where the CPU has it, which flushes
    subnormals: a row with any is stored again with the scalar rounding, so they survive."""
    g = randn(rows, 200)
    up = randn(rows, 200)
    up[:, ::7] = 3e-39  # silu(g) * up: bf16 subnormals in these columns, normal numbers elsewhere
    x = torch.cat((g, up), dim=1).to(BF16)
    got = cpu_ops.silu_and_mul(x)
    want = (torch.nn.functional.silu(x[:, :200].float()) * x[:, 200:].float()).to(BF16)
    tiny = want[:, ::7]
    assert (tiny != 0).any() and (tiny.float().abs() < 2.0**-126).all()
    assert torch.equal(got[:, ::7], tiny)
    _close_to_fp32(got, want.float())
    w = torch.full((96,), 1e-39)  # the norm's outputs: weight x normalised row, subnormal too
    out, _ = cpu_ops.rms_norm(randn(rows, 96).to(BF16), w.to(BF16), 1e-6)
    assert (out != 0).sum() > out.numel() // 2 and (out.float().abs() < 2.0**-126).all()
