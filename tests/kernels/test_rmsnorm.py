"""rms_norm with and without the fused residual add, against the references."""

from __future__ import annotations

import pytest
import torch
from kernel_refs import REF_NAMES, get_ref

from bulkrun_kernels.rmsnorm import rms_norm

NAN = float("nan")


def inputs(num_tokens, hidden, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    x, residual = (
        (torch.randn(num_tokens, hidden, generator=g) * 3).to(dtype),
        torch.randn(num_tokens, hidden, generator=g).to(dtype),
    )
    weight = (1 + torch.randn(hidden, generator=g) * 0.1).to(dtype)
    return x.to(device), residual.to(device), weight.to(device)


@pytest.mark.parametrize("ref_name", REF_NAMES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize(
    ("hidden", "dtype", "tol"),
    [(64, torch.float32, 1e-5), (48, torch.float32, 1e-5), (96, torch.bfloat16, 2e-2)],
)
def test_matches_reference(hidden, dtype, tol, with_residual, ref_name, device):
    x, residual, weight = inputs(7, hidden, dtype, device, seed=hidden)
    out = torch.full_like(x, NAN)
    res_out = torch.full_like(x, NAN) if with_residual else None
    got, got_res = rms_norm(
        x, weight, 1e-6, residual if with_residual else None, out=out, residual_out=res_out
    )
    ref = get_ref(ref_name)
    want, want_res = ref.rms_norm(x.cpu(), weight.cpu(), 1e-6, residual.cpu() if with_residual else None)
    assert got is out
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(got_res.cpu().float(), want_res.float(), atol=tol, rtol=tol)
    if not with_residual:
        assert got_res is x  # no residual: the new residual is x itself


@pytest.mark.parametrize("ref_name", REF_NAMES)
def test_many_short_rows(ref_name, device):
    # Per-head q/k norms: 150 rows of 32 share programs (64 rows each, the last one partial).
    x, residual, weight = inputs(150, 32, torch.float32, device, seed=2)
    out = torch.full_like(x, NAN)
    got, _ = rms_norm(x, weight, 1e-6, out=out)
    want, _ = get_ref(ref_name).rms_norm(x.cpu(), weight.cpu(), 1e-6)
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)


def test_residual_out_may_alias_residual(device):
    x, residual, weight = inputs(5, 32, torch.float32, device, seed=1)
    expected_res = x + residual
    out, new_res = rms_norm(x, weight, 1e-5, residual, residual_out=residual)
    assert new_res is residual
    torch.testing.assert_close(new_res, expected_res)
    assert not torch.isnan(out).any()


def test_strided_rows(device):
    # A row stride larger than hidden (e.g. a slice of a wider buffer) is read correctly.
    wide = torch.randn(6, 80, device=device)
    x = wide[:, :64]
    weight = torch.ones(64, device=device)
    got, _ = rms_norm(x, weight, 1e-6)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rejects_bad_arguments(device):
    x, residual, weight = inputs(3, 16, torch.float32, device, seed=0)
    with pytest.raises(ValueError, match="weight has 8 elements for hidden size 16"):
        rms_norm(x, weight[:8], 1e-6)
    with pytest.raises(ValueError, match="residual must match x"):
        rms_norm(x, weight, 1e-6, residual[:, :8])
    with pytest.raises(ValueError, match="residual_out needs a residual"):
        rms_norm(x, weight, 1e-6, residual_out=residual)
    with pytest.raises(ValueError, match="2-D"):
        rms_norm(x[0], weight, 1e-6)
