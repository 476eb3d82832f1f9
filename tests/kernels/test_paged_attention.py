"""Paged attention: mixed decode/chunk batches, scattered blocks, GQA, a large block index."""

from __future__ import annotations

import zlib

import pytest
import torch
from kernel_refs import REF_NAMES, get_ref

from bulkrun_kernels.paged_attention import paged_attention

NAN = float("nan")


def make_batch(query_lens, context_lens, *, num_q_heads, num_kv_heads, head_dim, block_size, num_blocks,
               seed, dtype=torch.float32, device="cpu", high_blocks=False):  # fmt: skip
    """Random q and cache; every sequence gets scattered blocks; everything unused is poisoned."""
    g = torch.Generator().manual_seed(seed)
    num_seqs = len(query_lens)
    blocks_per_seq = [-(-c // block_size) for c in context_lens]
    max_blocks = max(blocks_per_seq) + 2
    # Distinct random blocks; with high_blocks, the largest ids of the pool come first.
    pool = torch.randperm(num_blocks, generator=g)
    if high_blocks:
        pool = torch.cat([torch.arange(num_blocks - 1, num_blocks - 9, -1), pool[pool < num_blocks - 8]])
    # Table entries past a sequence's blocks hold garbage that must never be read.
    tables = torch.full((num_seqs, max_blocks), 2**30, dtype=torch.int32)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), NAN, dtype=dtype)
    v_cache = torch.full_like(k_cache, NAN)
    used = 0
    for s, (n_blocks, ctx) in enumerate(zip(blocks_per_seq, context_lens, strict=True)):
        tables[s, :n_blocks] = pool[used : used + n_blocks].int()
        used += n_blocks
        for p in range(ctx):  # only the context's slots hold numbers; the rest stays NaN
            b, o = int(tables[s, p // block_size]), p % block_size
            k_cache[b, o] = torch.randn(num_kv_heads, head_dim, generator=g).to(dtype)
            v_cache[b, o] = torch.randn(num_kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(sum(query_lens), num_q_heads, head_dim, generator=g).to(dtype)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(context_lens, dtype=torch.int32)
    tensors = (q, k_cache, v_cache, tables, qsl, seq_lens)
    return tuple(t.to(device) for t in tensors)


def run_and_compare(batch, ref, atol, rtol=1e-3, num_partitions=None, **options):
    q, k_cache, v_cache, tables, qsl, seq_lens = batch
    scale = q.shape[-1] ** -0.5
    out = torch.full_like(q, NAN)  # poisoned: an unwritten element fails
    got = paged_attention(
        q, k_cache, v_cache, tables, qsl, seq_lens, scale, out=out, num_partitions=num_partitions, **options
    )
    assert got is out
    # The poison is for the kernel; references get clean copies (the CPU path reads whole blocks).
    cpu = [t.cpu() for t in batch]
    cpu[1], cpu[2] = cpu[1].nan_to_num(0.0), cpu[2].nan_to_num(0.0)
    cpu[3] = torch.where(cpu[3] == 2**30, 0, cpu[3])
    want = ref.paged_attention(*cpu, scale)
    assert not torch.isnan(got).any(), "kernel left output elements unwritten (NaN)"
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=atol, rtol=rtol)


CASES = {
    # name: (query_lens, context_lens, heads q/kv, head_dim, block_size)
    "mixed_gqa4": ([1, 7, 1, 20, 3, 1], [5, 7, 30, 25, 3, 17], (8, 2), 16, 4),
    "mixed_group3": ([1, 9, 1, 4], [40, 9, 1, 12], (6, 2), 16, 8),
    "mha_block16": ([1, 1, 33, 1], [16, 31, 49, 2], (2, 2), 32, 16),
    "prefill_heavy": ([37, 1, 50], [37, 20, 64], (4, 1), 16, 16),  # larger query blocks
    "odd_head_dim": ([3, 1, 5], [3, 9, 14], (4, 2), 24, 4),  # head_dim padded to 32
    "mqa_group16": ([2, 1], [18, 5], (16, 1), 16, 8),
    # a prompt step's last layer: each sequence's last row where it samples, none where it does not
    "sampled_rows": ([1, 0, 1, 0, 0, 1], [9, 11, 4, 30, 2, 17], (6, 2), 16, 4),
}


@pytest.mark.parametrize("ref_name", REF_NAMES)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, ref_name, device):
    query_lens, context_lens, (hq, hkv), head_dim, block_size = CASES[case]
    batch = make_batch(query_lens, context_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
                       block_size=block_size, num_blocks=64, seed=zlib.crc32(case.encode()), device=device)  # fmt: skip
    run_and_compare(batch, get_ref(ref_name), atol=2e-5)


@pytest.mark.parametrize("num_partitions", [1, 4], ids=["unsplit", "split-kv"])
def test_sequences_without_query_rows(num_partitions, device):
    """A prompt step's last layer asks for the sampling rows alone: sequences of no query rows among them."""
    query_lens, context_lens, (hq, hkv), head_dim, block_size = CASES["sampled_rows"]
    batch = make_batch(query_lens, context_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
                       block_size=block_size, num_blocks=64, seed=11, device=device)  # fmt: skip
    run_and_compare(batch, get_ref("naive"), atol=2e-5, num_partitions=num_partitions)


@pytest.mark.parametrize("num_partitions", [1, 4], ids=["unsplit", "split-kv"])
@pytest.mark.parametrize("ref_name", REF_NAMES)
def test_large_block_index(ref_name, num_partitions, device):
    # Block ids past 2**16 (280,000 slots); sequences live in the highest ids. Tiny heads keep it ~10 MB.
    batch = make_batch([1, 6, 1], [40, 30, 3], num_q_heads=2, num_kv_heads=1, head_dim=8, block_size=4,
                       num_blocks=70_000, seed=7, device=device, high_blocks=True)  # fmt: skip
    assert int(batch[3][batch[3] < 2**30].max()) == 69_999
    run_and_compare(batch, get_ref(ref_name), atol=2e-5, num_partitions=num_partitions)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype, device):
    batch = make_batch([1, 5, 1, 12], [9, 5, 33, 20], num_q_heads=4, num_kv_heads=2, head_dim=16,
                       block_size=8, num_blocks=32, seed=3, dtype=dtype, device=device)  # fmt: skip
    run_and_compare(batch, get_ref("naive"), atol=2e-2, rtol=2e-2)


def test_decode_only_equals_last_row_of_prefill(device):
    # The same sequence seen as a whole prompt and as a decode step gives the same last row.
    q, k_cache, v_cache, tables, _, _ = make_batch(
        [10],
        [10],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        num_blocks=16,
        seed=11,
        device=device,
    )
    scale = 0.25
    one = lambda n: torch.tensor(n, dtype=torch.int32, device=device)  # noqa: E731
    full = paged_attention(q, k_cache, v_cache, tables, one([0, 10]), one([10]), scale)
    last = paged_attention(q[-1:], k_cache, v_cache, tables, one([0, 1]), one([10]), scale)
    torch.testing.assert_close(full[-1:], last, atol=1e-6, rtol=1e-5)


def test_rejects_bad_arguments(device):
    q, k_cache, v_cache, tables, qsl, seq_lens = make_batch(
        [1, 2],
        [3, 2],
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        num_blocks=8,
        seed=1,
        device=device,
    )
    with pytest.raises(ValueError, match="int32"):
        paged_attention(q, k_cache, v_cache, tables.long(), qsl, seq_lens, 1.0)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention(q[:, :3], k_cache, v_cache, tables, qsl, seq_lens, 1.0)
    with pytest.raises(ValueError, match="batch sizes disagree"):
        paged_attention(q, k_cache, v_cache, tables, qsl[:-1], seq_lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        paged_attention(q, k_cache[..., :8], v_cache[..., :8], tables, qsl, seq_lens, 1.0)
    with pytest.raises(ValueError, match="dtype"):
        paged_attention(q.double(), k_cache, v_cache, tables, qsl, seq_lens, 1.0)
    with pytest.raises(ValueError, match="3-D"):
        paged_attention(q[0], k_cache, v_cache, tables, qsl, seq_lens, 1.0)
