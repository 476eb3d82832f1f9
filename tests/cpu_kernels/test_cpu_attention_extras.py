"""The CPU native paged attention with a sliding window, attention sinks and soft-capping, against the
PyTorch reference: decode rows (the few-rows path), prompt chunks (with earlier context), windows
that start inside, at and across block and 16-key-group boundaries, head sizes 64 and 256, fp32 and
bf16 (on AMX tiles where the CPU has them, as every bf16 item)."""

from __future__ import annotations

import pytest
import torch
from test_cpu_attention import GARBAGE_BLOCK, NAN, make_batch

from bulkrun_kernels import cpu_ops, reference

# decode rows and chunks together, contexts across many blocks of 16 (and 16-key groups)
QUERY_LENS = [1, 1, 1, 7, 40, 33, 1, 3]
CONTEXT_LENS = [1, 17, 200, 7, 40, 100, 64, 300]


def check(batch, dtype=torch.float32, **extras):
    q, k_cache, v_cache, tables, starts, lens = batch
    q, k_cache, v_cache = (t.to(dtype) for t in (q, k_cache, v_cache))
    scale = q.shape[-1] ** -0.5
    out = torch.full_like(q, NAN)
    got = cpu_ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, scale, out=out, **extras)
    assert got is out and not torch.isnan(got).any(), "an output element was not written"
    clean = (k_cache.float().nan_to_num(0.0), v_cache.float().nan_to_num(0.0),
             torch.where(tables == GARBAGE_BLOCK, 0, tables))  # fmt: skip
    want = reference.paged_attention(q.float(), *clean, starts, lens, scale, **extras)
    atol, rtol = (2e-5, 1e-4) if dtype == torch.float32 else (1e-2, 8e-3)
    torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol)


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])


@DTYPES
@pytest.mark.parametrize("window", [1, 2, 5, 15, 16, 17, 31, 32, 33, 64, 100, 299, 300, 4096])
def test_sliding_window(window, dtype):
    check(make_batch(QUERY_LENS, CONTEXT_LENS, seed=window), dtype, window=window)


@pytest.mark.parametrize("block_size", [3, 16, 32])
def test_window_with_block_sizes_that_do_not_match_key_groups(block_size):
    check(make_batch([1, 9, 1], [50, 45, 13], block_size=block_size, seed=block_size), window=10)


@pytest.mark.parametrize("window", [4095, 4096])
def test_window_of_4096_over_a_longer_context(window):
    batch = make_batch([1, 2, 70], [4100, 4130, 4200], heads=(2, 1), head_dim=32, seed=3)
    check(batch, window=window)


@DTYPES
@pytest.mark.parametrize("head_dim", [64, 256])
def test_sinks(head_dim, dtype):
    sinks = torch.tensor([0.5, -1.0, 3.0, 8.0, 0.0, -30.0])  # 8: the sink takes most of the mass
    check(make_batch(QUERY_LENS, CONTEXT_LENS, head_dim=head_dim, seed=1), dtype, sinks=sinks)


@DTYPES
@pytest.mark.parametrize("head_dim", [64, 256])
def test_softcap(head_dim, dtype):
    q, *rest = make_batch(QUERY_LENS, CONTEXT_LENS, head_dim=head_dim, seed=2)
    check((q * 8, *rest), dtype, softcap=5.0)  # large scores: the cap bites


@DTYPES
def test_all_three_together(dtype):
    sinks = torch.tensor([1.0, 0.0, -2.0, 0.25, 4.0, -1.0])
    check(make_batch(QUERY_LENS, CONTEXT_LENS, seed=4), dtype, window=20, sinks=sinks, softcap=7.0)


def test_gqa_group_of_eight_with_a_window():
    check(make_batch([1, 1, 12], [30, 90, 40], heads=(16, 2), seed=5), window=9)


def test_bad_sinks_are_refused():
    batch = make_batch([1], [5])
    with pytest.raises(RuntimeError, match="sinks"):
        cpu_ops.paged_attention(*batch, 0.1, sinks=torch.zeros(5))
