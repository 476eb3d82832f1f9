"""silu_and_mul and gelu_tanh_and_mul: the gated-MLP activations over a fused gate/up projection output."""

from __future__ import annotations

import pytest
import torch
from kernel_refs import REF_NAMES, get_ref

from bulkrun_kernels import activation, reference
from bulkrun_kernels.activation import silu_and_mul


@pytest.mark.parametrize("ref_name", REF_NAMES)
@pytest.mark.parametrize(
    ("inter", "dtype", "tol"),
    [(40, torch.float32, 1e-5), (1500, torch.float32, 1e-5), (64, torch.bfloat16, 2e-2)],
)
def test_matches_reference(inter, dtype, tol, ref_name, device):
    g = torch.Generator().manual_seed(inter)
    x = (torch.randn(5, 2 * inter, generator=g) * 4).to(dtype).to(device)
    out = torch.full((5, inter), float("nan"), dtype=dtype, device=device)
    got = silu_and_mul(x, out=out)
    assert got is out
    want = get_ref(ref_name).silu_and_mul(x.cpu())
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)


def test_rejects_odd_width(device):
    with pytest.raises(ValueError, match="must be even"):
        silu_and_mul(torch.randn(2, 7, device=device))


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_gelu_tanh_matches_torch(dtype, tol, device):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(6, 2 * 300, generator=g) * 4).to(dtype).to(device)
    got = activation.gelu_tanh_and_mul(x)
    want = reference.gelu_tanh_and_mul(x.cpu().float())
    torch.testing.assert_close(got.cpu().float(), want, atol=tol, rtol=tol)
