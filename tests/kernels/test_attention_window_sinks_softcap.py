"""Paged attention with a sliding window, attention sinks and score soft-capping (Triton kernel),
against the dense masked softmax of kernel_naive and the PyTorch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_refs import REF_NAMES, get_ref
from test_paged_attention import NAN, make_batch

from bulkrun_kernels.paged_attention import paged_attention

# decode rows and prompt chunks of one batch, contexts crossing many blocks of 4
QUERY_LENS = [1, 7, 1, 20, 3, 1, 40]
CONTEXT_LENS = [5, 7, 30, 25, 3, 130, 90]
WINDOWS = [1, 2, 3, 4, 5, 7, 16, 17, 33, 64, 129]


def _compare(batch, ref, atol=2e-5, num_partitions=None, **extras):
    q, k_cache, v_cache, tables, qsl, seq_lens = batch
    scale = q.shape[-1] ** -0.5
    out = torch.full_like(q, NAN)
    got = paged_attention(q, k_cache, v_cache, tables, qsl, seq_lens, scale, out=out,
                          num_partitions=num_partitions, **extras)  # fmt: skip
    cpu = [t.cpu() for t in batch]
    cpu[1], cpu[2] = cpu[1].nan_to_num(0.0), cpu[2].nan_to_num(0.0)
    cpu[3] = torch.where(cpu[3] == 2**30, 0, cpu[3])
    cpu_extras = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in extras.items()}
    want = ref.paged_attention(*cpu, scale, **cpu_extras)
    assert not torch.isnan(got).any(), "kernel left output elements unwritten (NaN)"
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=atol, rtol=1e-3)


def _batch(device, seed=5, query_lens=QUERY_LENS, context_lens=CONTEXT_LENS, block_size=4):
    return make_batch(query_lens, context_lens, num_q_heads=4, num_kv_heads=2, head_dim=16,
                      block_size=block_size, num_blocks=128, seed=seed, device=device)  # fmt: skip


@pytest.mark.parametrize("num_partitions", [1, 3], ids=["unsplit", "split-kv"])
@pytest.mark.parametrize("window", WINDOWS)
def test_sliding_window(window, num_partitions, device):
    _compare(_batch(device), get_ref("naive"), window=window, num_partitions=num_partitions)


@pytest.mark.parametrize("ref_name", REF_NAMES)
def test_window_against_both_references(ref_name, device):
    _compare(_batch(device, seed=9, block_size=16), get_ref(ref_name), window=13)


@pytest.mark.parametrize("num_partitions", [1, 4], ids=["unsplit", "split-kv"])
@pytest.mark.parametrize("ref_name", REF_NAMES)
def test_sinks(ref_name, num_partitions, device):
    sinks = torch.tensor([0.5, -1.0, 3.0, 8.0], device=device)  # 8: the sink takes most of the mass
    _compare(_batch(device, seed=2), get_ref(ref_name), sinks=sinks, num_partitions=num_partitions)


@pytest.mark.parametrize("ref_name", REF_NAMES)
def test_softcap(ref_name, device):
    q, *rest = _batch(device, seed=4)
    _compare((q * 6, *rest), get_ref(ref_name), softcap=2.5)  # large scores: the cap bites


@pytest.mark.parametrize("num_partitions", [1, 4], ids=["unsplit", "split-kv"])
def test_all_three_together(num_partitions, device):
    sinks = torch.tensor([1.0, 0.0, -2.0, 0.25], device=device)
    _compare(_batch(device, seed=8), get_ref("naive"), window=6, sinks=sinks, softcap=3.0,
             num_partitions=num_partitions)  # fmt: skip


@pytest.mark.parametrize("window", [4095, 4096])
def test_long_window_over_a_long_context(window, device):
    # a window of 4,096 on contexts just longer than it: decode rows and a chunk, split and not
    batch = make_batch([1, 3, 1], [4100, 4099, 300], num_q_heads=2, num_kv_heads=1, head_dim=16,
                       block_size=16, num_blocks=600, seed=1, device=device)  # fmt: skip
    for parts in (1, 8):
        _compare(batch, get_ref("reference"), window=window, num_partitions=parts)


@pytest.mark.parametrize("window", [0, 1, 3, 17, 200])
def test_reference_equals_the_dense_masked_softmax(window):
    # the PyTorch reference (the CPU path and what the other backends are held to) against the
    # naive dense loops, with a window, sinks and soft-capping (no Triton involved)
    q, k_cache, v_cache, tables, qsl, seq_lens = _batch("cpu", seed=window)
    clean = (q * 4, k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0), torch.where(tables == 2**30, 0, tables),
             qsl, seq_lens)  # fmt: skip
    extras = dict(window=window, sinks=torch.tensor([0.0, 2.0, -1.0, 5.0]), softcap=4.0)
    want = get_ref("naive").paged_attention(*clean, 0.25, **extras)
    torch.testing.assert_close(get_ref("reference").paged_attention(*clean, 0.25, **extras), want)


def test_bad_extras_are_refused(device):
    batch = _batch(device)
    with pytest.raises(ValueError, match="window"):
        paged_attention(*batch, 0.25, window=-1)
    with pytest.raises(ValueError, match="sinks"):
        paged_attention(*batch, 0.25, sinks=torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="softcap"):
        paged_attention(*batch, 0.25, softcap=-1.0)
