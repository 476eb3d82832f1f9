"""The CPU native attention and the reference: a query row's bits do not depend on its chunk or batch."""

from __future__ import annotations

import pytest
import torch
from helpers.attention_rows import three_ways

from bulkrun_kernels import cpu_build, reference

NATIVE = cpu_build.compiler_available() and cpu_build.load()


@pytest.mark.skipif(not NATIVE, reason="no native kernels")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_attention_rows_are_batch_invariant(dtype):
    from bulkrun_kernels import cpu_ops

    chunk, chunks, alone = three_ways(cpu_ops.paged_attention, dtype, "cpu")
    assert torch.equal(chunk, alone) and torch.equal(chunks, alone)


@pytest.mark.skipif(not NATIVE, reason="no native kernels")
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 2), (16, 2), (26, 2)])
@pytest.mark.parametrize("extras", [{}, {"window": 5}, {"softcap": 8.0, "window": 19}, {"sinks": True}])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_attention_invariant_for_every_group_and_extra(heads, kv_heads, extras, dtype):
    """Every group size (the few-rows path and, for wider groups, the many-row one) and every extra:
    each token's bits are its own alone, with windows shorter than a chunk, soft-capping and sinks."""
    from bulkrun_kernels import cpu_ops

    if extras.get("sinks"):
        extras = {"sinks": torch.linspace(-1.0, 2.0, heads)}
    chunk, chunks, alone = three_ways(cpu_ops.paged_attention, dtype, "cpu", heads=heads,
                                      kv_heads=kv_heads, head_dim=64, **extras)  # fmt: skip
    assert torch.equal(chunk, alone) and torch.equal(chunks, alone)
    reference_rows = three_ways(reference.paged_attention, torch.float32, "cpu", heads=heads,
                                kv_heads=kv_heads, head_dim=64, **extras)[2]  # fmt: skip
    torch.testing.assert_close(alone.float(), reference_rows, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not NATIVE, reason="no native kernels")
def test_cpu_attention_without_invariance_differs():
    """The check has power: without invariance the many-row fp32 prompt path scores rows against
    transposed keys (fewer operations), which gives other bits than decode rows. (bf16 items on AMX
    or AVX512-BF16 dot products compute a row alike in any tile, so there it holds either way.)"""
    from bulkrun_kernels import cpu_ops

    chunk, _, alone = three_ways(cpu_ops.paged_attention, torch.float32, "cpu", batch_invariant=False)
    torch.testing.assert_close(chunk, alone, atol=1e-5, rtol=1e-5)
    assert not torch.equal(chunk, alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extras", [{}, {"window": 5}, {"softcap": 8.0, "window": 19}, {"sinks": True}])
def test_reference_attention_rows_are_batch_invariant(dtype, extras):
    if extras.get("sinks"):
        extras = {"sinks": torch.linspace(-1.0, 2.0, 6)}
    chunk, chunks, alone = three_ways(reference.paged_attention, dtype, "cpu", **extras)
    assert torch.equal(chunk, alone) and torch.equal(chunks, alone)
    # and it is attention: SDPA's rows (not invariant) agree to rounding
    sdpa = three_ways(reference.paged_attention, dtype, "cpu", batch_invariant=False, **extras)[2]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(alone.float(), sdpa.float(), atol=tol, rtol=tol)


def test_reference_attention_without_invariance_differs():
    """The check has power: SDPA per chunk and per decode group gives fp32 rows other bits."""
    chunk, _, alone = three_ways(reference.paged_attention, torch.float32, "cpu", batch_invariant=False)
    assert not torch.equal(chunk, alone)


@pytest.mark.skipif(not NATIVE, reason="no native kernels")
@pytest.mark.parametrize(
    "head_dim,extras", [(64, {}), (128, {"window": 40}), (64, {"softcap": 8.0, "sinks": True})]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_attention_long_chunks_are_batch_invariant(head_dim, extras, dtype):
    """A 150-token chunk (several work items of the many-row paths, partial row blocks) after 50
    cached tokens: every row's bits equal the row alone as a decode step, and a 33-token re-chunking."""
    from bulkrun_kernels import cpu_ops

    g = torch.Generator().manual_seed(3)
    context, queries, heads, kv_heads, block = 200, 150, 6, 2, 16
    blocks = -(-context // block)
    k = torch.randn(blocks + 1, block, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(blocks + 1, block, kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(queries, heads, head_dim, generator=g).to(dtype)
    table = torch.arange(blocks, dtype=torch.int32).flip(0).view(1, -1).contiguous()
    if extras.get("sinks"):
        extras = {**extras, "sinks": torch.linspace(-1.0, 2.0, heads)}

    def rows(start: int, stop: int) -> torch.Tensor:
        qsl = torch.tensor([0, stop - start], dtype=torch.int32)
        lens = torch.tensor([context - queries + stop], dtype=torch.int32)
        return cpu_ops.paged_attention(q[start:stop], k, v, table, qsl, lens, head_dim**-0.5, **extras)

    whole = rows(0, queries)
    alone = torch.cat([rows(i, i + 1) for i in range(queries)])
    rechunked = torch.cat([rows(s, min(s + 33, queries)) for s in range(0, queries, 33)])
    assert torch.equal(whole, alone) and torch.equal(rechunked, alone)
