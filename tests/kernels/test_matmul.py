"""The fixed-tile Triton matmul: matches the product, and each row's bits do not depend on M."""

from __future__ import annotations

import pytest
import torch

from bulkrun_kernels.matmul import matmul


def _inputs(rows, n, k, dtype, device, bias):
    g = torch.Generator().manual_seed(rows * 7 + n)
    x = torch.randn(rows, k, generator=g).to(dtype).to(device)
    w = torch.randn(n, k, generator=g).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device) if bias else None
    return x, w, b


@pytest.mark.parametrize(("n", "k"), [(96, 80), (64, 64), (33, 130)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_torch(n, k, dtype, bias, device):
    x, w, b = _inputs(70, n, k, dtype, device, bias)
    want = x.float() @ w.float().T + (b.float() if bias else 0)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(matmul(x, w, b).float().cpu(), want.cpu(), atol=tol * k**0.5, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_batch(dtype, device, row_invariant_dot):
    x, w, b = _inputs(130, 72, 96, dtype, device, True)
    full = matmul(x, w, b)
    for rows in (1, 5, 64, 65, 129):
        assert torch.equal(matmul(x[:rows], w, b), full[:rows]), rows
    perm = torch.randperm(130, generator=torch.Generator().manual_seed(1)).to(device)
    assert torch.equal(matmul(x[perm], w, b), full[perm])


def test_rejects_bad_shapes(device):
    x, w, _ = _inputs(4, 8, 16, torch.float32, device, False)
    with pytest.raises(ValueError, match="columns"):
        matmul(x, w[:, :8])
    with pytest.raises(ValueError, match="dtype"):
        matmul(x, w.bfloat16())
