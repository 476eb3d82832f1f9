"""Split-KV (flash-decoding) attention and the production shapes: bf16 and fp32, head_dim 64 and 128,
GQA 4 and 8, contexts from 1 to 8,192 keys, mixed prefill/decode batches, against the references.

Few heads and only a couple of long decode rows keep the interpreter (TRITON_INTERPRET=1) quick."""

from __future__ import annotations

import pytest
import torch
from kernel_refs import get_ref
from test_paged_attention import make_batch, run_and_compare

from bulkrun_kernels import paged_attention as pa
from bulkrun_kernels.paged_attention import paged_attention, plan_partitions

TOLERANCE = {torch.float32: (2e-5, 1e-3), torch.bfloat16: (2e-2, 2e-2)}


def production_case(query_lens, context_lens, dtype, head_dim, group, device):
    """One kv head (few heads keep the interpreter quick); the wrapper plans the partitions itself
    (not batch invariant: the planner's split-KV and the step-shaped tiles)."""
    batch = make_batch(query_lens, context_lens, num_q_heads=group, num_kv_heads=1, head_dim=head_dim,
                       block_size=16, num_blocks=560, seed=head_dim + group, dtype=dtype, device=device)  # fmt: skip
    atol, rtol = TOLERANCE[dtype]
    run_and_compare(batch, get_ref("reference"), atol=atol, rtol=rtol, batch_invariant=False)


# Between them the two tests below cover both dtypes, both head dims and both groups with each other.
@pytest.mark.parametrize(
    ("dtype", "head_dim", "group"),
    [(torch.bfloat16, 128, 8), (torch.float32, 64, 4)],
    ids=["bf16-d128-gqa8", "fp32-d64-gqa4"],
)
def test_long_context_decode(dtype, head_dim, group, device, monkeypatch):
    # 8,192 keys: split over the full partition count, beside a one-key row.
    planned = []
    monkeypatch.setattr(pa, "plan_partitions", lambda *a: planned.append(plan_partitions(*a)) or planned[-1])
    production_case([1, 1], [8192, 1], dtype, head_dim, group, device)
    assert planned == [pa.MAX_PARTITIONS]


@pytest.mark.parametrize(
    ("dtype", "head_dim", "group"),
    [(torch.bfloat16, 64, 8), (torch.float32, 128, 4)],
    ids=["bf16-d64-gqa8", "fp32-d128-gqa4"],
)
def test_mixed_prefill_decode_batch(dtype, head_dim, group, device):
    # Decode rows of 1..600 keys, a prompt chunk after earlier context, a whole prompt.
    production_case([1, 1, 24, 1, 17], [1, 600, 200, 17, 17], dtype, head_dim, group, device)


@pytest.mark.parametrize("num_partitions", [1, 3, 12])
def test_any_partition_count_matches_reference(num_partitions, device):
    # More partitions than tiles leaves some empty: they must weigh nothing in the reduction.
    batch = make_batch([1, 7, 1, 20, 1], [100, 7, 1, 40, 20], num_q_heads=4, num_kv_heads=1, head_dim=32,
                       block_size=16, num_blocks=64, seed=5, device=device)  # fmt: skip
    run_and_compare(batch, get_ref("naive"), atol=2e-5, num_partitions=num_partitions)


@pytest.mark.parametrize("num_partitions", [1, 4])
def test_padding_rows_give_zeros(num_partitions, device):
    # A CUDA-graph batch padded with rows of no context (seq_len 0) and with empty sequences (no
    # query rows): the real rows are right, the padding rows are zeros, nothing is NaN.
    batch = make_batch([1, 1], [50, 9], num_q_heads=4, num_kv_heads=1, head_dim=16, block_size=16,
                       num_blocks=8, seed=2, device=device)  # fmt: skip
    q, k_cache, v_cache, tables, _, _ = batch
    k_cache, v_cache = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    tables = torch.where(tables == 2**30, 0, tables)
    pad_q = torch.cat([q, torch.randn(2, 4, 16, device=device)])
    pad_tables = torch.cat([tables, torch.zeros(3, tables.shape[1], dtype=torch.int32, device=device)])
    as_int = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
    qsl, seq_lens = as_int([0, 1, 2, 3, 4, 4]), as_int([50, 9, 0, 0, 0])
    got = paged_attention(
        pad_q, k_cache, v_cache, pad_tables, qsl, seq_lens, 0.25, num_partitions=num_partitions
    )
    want = paged_attention(q, k_cache, v_cache, tables, qsl[:3], seq_lens[:2], 0.25, num_partitions=1)
    torch.testing.assert_close(got[:2], want, atol=2e-5, rtol=1e-3)
    assert torch.equal(got[2:], torch.zeros_like(got[2:]))


def test_rejects_bad_partition_count(device):
    batch = make_batch([1], [5], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4, num_blocks=4,
                       seed=1, device=device)  # fmt: skip
    with pytest.raises(ValueError, match="num_partitions"):
        paged_attention(*batch, 1.0, num_partitions=pa.MAX_PARTITIONS + 1)


def plan(num_tokens, num_seqs, context_bound, *, block_q=4, num_kv_heads=8, row_bytes=32 * 128 * 4):
    return plan_partitions(num_tokens, num_seqs, block_q, num_kv_heads, context_bound, row_bytes, 132)


def test_plan_splits_small_batches_and_long_contexts_only():
    assert plan(1, 1, 8192) == pa.MAX_PARTITIONS  # one sequence: 8 programs for 132 SMs
    assert plan(1, 1, 512) == 2  # ... but a partition keeps >= MIN_PARTITION_KEYS keys
    assert plan(1, 1, 16) == 1
    assert plan(1024, 1024, 1024) == 1  # 8,192 programs already fill the device
    assert plan(256, 256, 32768) == 8  # a long context is cut to LONG_PARTITION_KEYS pieces
    assert plan(4096, 8, 4096, block_q=16) == 1  # a prefill-heavy step has programs enough ...
    assert plan(2048, 1, 65536, block_q=16) == 1  # ... and is not cut for length
    # the scratch stays within its budget: 1,024 rows of 16 KiB allow 4 partitions
    assert plan(1024, 1024, 65536) == pa.SCRATCH_BYTES // (1024 * 32 * 128 * 4)
