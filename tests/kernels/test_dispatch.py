"""get_ops: one namespace per backend; triton imported only when asked for."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bulkrun_kernels import get_ops, resolve_backend

OPS = ("paged_attention", "write_kv", "rms_norm", "rotary", "silu_and_mul", "gelu_tanh_and_mul")


def test_reference_backend_has_every_op():
    ops = get_ops("reference")
    assert ops.backend == "reference"
    assert all(callable(getattr(ops, name)) for name in OPS)
    assert ops.rms_norm.__module__ == "bulkrun_kernels.reference"


def test_triton_backend_has_every_op(device):
    ops = get_ops("triton", device)
    assert ops.backend == "triton"
    assert {getattr(ops, name).__module__.split(".")[-1] for name in OPS} == {
        "paged_attention", "kv_write", "rmsnorm", "rotary", "activation"
    }  # fmt: skip


@pytest.mark.parametrize(("native_builds", "expected"), [(True, "cpu"), (False, "reference")])
def test_auto_on_the_cpu_takes_the_native_kernels_only_where_they_load(monkeypatch, native_builds, expected):
    # whether the build works here is forced both ways (tests/cpu_kernels covers the build itself)
    from bulkrun_kernels import cpu_build

    monkeypatch.setattr(cpu_build, "load", lambda: native_builds)
    assert resolve_backend("auto", "cpu") == expected
    assert resolve_backend("auto", None) == expected
    assert resolve_backend("reference", "cpu") == "reference"


@pytest.mark.parametrize(("has_triton", "expected"), [(True, "triton"), (False, "reference")])
def test_auto_on_cuda_takes_triton_only_where_it_is_installed(monkeypatch, has_triton, expected):
    import bulkrun_kernels

    monkeypatch.setattr(bulkrun_kernels, "triton_available", lambda: has_triton)
    assert resolve_backend("auto", torch.device("cuda", 0)) == expected
    assert resolve_backend("auto", "cuda:1") == expected
    assert resolve_backend("reference", "cuda") == "reference"


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="unknown kernel backend 'cutlass'"):
        get_ops("cutlass")


def test_both_backends_agree_on_a_step(device):
    # The ops chained as one layer's attention calls them, once per backend, on identical inputs.
    g = torch.Generator().manual_seed(0)
    hq, hkv, d, bs = 4, 2, 16, 4
    x = torch.randn(6, hq * d, generator=g)
    k_new, v_new = torch.randn(6, hkv, d, generator=g), torch.randn(6, hkv, d, generator=g)
    # seq 0: a 5-token prompt into blocks 2, 3; seq 1: one decode token at position 5 (slot 5*4+1),
    # its positions 0..4 already cached in blocks 4, 5.
    slots = torch.tensor([8, 9, 10, 11, 12, 21])
    tables = torch.tensor([[2, 3], [4, 5]], dtype=torch.int32)
    qsl = torch.tensor([0, 5, 6], dtype=torch.int32)
    seq_lens = torch.tensor([5, 6], dtype=torch.int32)
    caches = torch.randn(2, 8, bs, hkv, d, generator=g)
    positions = torch.tensor([0, 1, 2, 3, 4, 5])
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    freqs = torch.outer(torch.arange(16).float(), inv_freq)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    results = []
    for backend in ("reference", "triton"):
        ops = get_ops(backend, device)
        xs, kn, vn, sl, bt, qs, sls, kv, pos, cs = (
            t.to(device)
            for t in (x, k_new, v_new, slots, tables, qsl, seq_lens, caches.clone(), positions, cos_sin)
        )
        normed, _ = ops.rms_norm(xs, torch.ones(hq * d, device=device), 1e-6)
        q, kn = ops.rotary(normed.view(6, hq, d), kn, pos, cs)
        ops.write_kv(kn, vn, kv[0], kv[1], sl)
        out = ops.paged_attention(q, kv[0], kv[1], bt, qs, sls, d**-0.5)
        results.append(ops.silu_and_mul(out.view(6, -1)).cpu())
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-4)


def test_import_does_not_load_triton():
    code = "import sys, bulkrun_kernels; bulkrun_kernels.get_ops; assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
