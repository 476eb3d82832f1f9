"""The CPU native paged attention (float32 and bfloat16) against the PyTorch reference: decode rows, prompt chunks with and
without earlier context, GQA, every head size it takes, block sizes that do and do not divide its
16-key groups, block ids past 2^16, poisoned unused cache slots and table entries, strided q."""

from __future__ import annotations

import os

import pytest
import torch

from bulkrun_kernels import cpu_ops, reference

NAN = float("nan")
GARBAGE_BLOCK = 2**30


def make_batch(query_lens, context_lens, *, heads=(6, 2), head_dim=64, block_size=16, seed=0,
               num_blocks=None, top_ids=False):  # fmt: skip
    """q, cache, tables, lengths; every slot no sequence owns is NaN, table tails are garbage."""
    g = torch.Generator().manual_seed(seed)
    num_q_heads, num_kv_heads = heads
    per_seq = [-(-c // block_size) for c in context_lens]
    num_blocks = num_blocks or sum(per_seq) + 8
    ids = torch.randperm(num_blocks, generator=g)[: sum(per_seq)]
    if top_ids:  # the pool's largest ids, in a scrambled order
        ids = num_blocks - 1 - torch.randperm(sum(per_seq), generator=g)
    tables = torch.full((len(per_seq), max(per_seq) + 2), GARBAGE_BLOCK, dtype=torch.int32)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), NAN)
    v_cache = torch.full_like(k_cache, NAN)
    used = 0
    for s, (n, ctx) in enumerate(zip(per_seq, context_lens, strict=True)):
        tables[s, :n] = ids[used : used + n].int()
        used += n
        for p in range(ctx):
            b, o = int(tables[s, p // block_size]), p % block_size
            k_cache[b, o] = torch.randn(num_kv_heads, head_dim, generator=g)
            v_cache[b, o] = torch.randn(num_kv_heads, head_dim, generator=g)
    q = torch.randn(sum(query_lens), num_q_heads, head_dim, generator=g)
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, k_cache, v_cache, tables, starts, torch.tensor(context_lens, dtype=torch.int32)


def check(batch, q=None, dtype=torch.float32):
    """The native kernel on `dtype` tensors against the float32 reference on the same values
    (for bf16: within one bf16 rounding of the output, as it computes in float32)."""
    q0, k_cache, v_cache, tables, starts, lens = batch
    q = q0 if q is None else q
    q, k_cache, v_cache = (t.to(dtype) for t in (q, k_cache, v_cache))  # NaN slots stay NaN
    scale = q.shape[-1] ** -0.5
    out = torch.full_like(q0, NAN, dtype=dtype)
    got = cpu_ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, scale, out=out)
    assert got is out and not torch.isnan(got).any(), "an output element was not written"
    clean = (
        k_cache.float().nan_to_num(0.0),
        v_cache.float().nan_to_num(0.0),
        torch.where(tables == GARBAGE_BLOCK, 0, tables),
    )
    want = reference.paged_attention(q.float().contiguous(), *clean, starts, lens, scale)
    atol, rtol = (2e-5, 1e-4) if dtype == torch.float32 else (1e-2, 8e-3)
    torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol)


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])


CASES = {
    "decode": ([1] * 7, [1, 15, 16, 17, 33, 200, 64]),
    "prompts": ([5, 16, 17, 40], [5, 16, 17, 40]),
    "chunks after cached context": ([3, 20, 33], [40, 20, 100]),
    "mixed decode and chunks": ([1, 12, 1, 64, 1], [90, 12, 3, 70, 17]),
    "long": ([1, 150], [700, 300]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@DTYPES
def test_matches_reference(name, dtype):
    check(make_batch(*CASES[name]), dtype=dtype)


@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (8, 1), (12, 3)])
@DTYPES
def test_grouped_query_heads(heads, dtype):
    check(make_batch([1, 9, 1], [30, 25, 48], heads=heads, seed=1), dtype=dtype)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6])
@DTYPES
def test_every_decode_sized_row_count(group, dtype):
    # items of 1-5 rows per kv head walk the keys once for all kv heads; 6 and more take the tiled path
    check(make_batch([1, 2, 1, 3], [40, 37, 1, 70], heads=(2 * group, 2), seed=6), dtype=dtype)


@pytest.mark.parametrize("head_dim", [16, 32, 48, 80, 128, 256])
@DTYPES
def test_head_sizes(head_dim, dtype):
    check(make_batch([1, 19], [40, 19], head_dim=head_dim, seed=2), dtype=dtype)


@pytest.mark.parametrize("block_size", [1, 4, 8, 16, 32, 48])
@DTYPES
def test_block_sizes_that_split_key_groups(block_size, dtype):
    check(make_batch([1, 21, 2], [37, 21, 50], block_size=block_size, seed=3), dtype=dtype)


def test_block_ids_past_two_to_the_sixteen():
    batch = make_batch(
        [1, 18], [40, 18], block_size=1, heads=(2, 1), head_dim=16, num_blocks=70_000, top_ids=True
    )
    assert int(batch[3][batch[3] != GARBAGE_BLOCK].max()) > 2**16
    check(batch)


def test_strided_q_as_sliced_from_a_fused_projection():
    batch = make_batch([1, 10], [20, 10], heads=(4, 2), head_dim=32, seed=4)
    wide = torch.randn(batch[0].shape[0], 4 * 32 + 64)  # q sits at the front of each qkv row
    q = wide[:, : 4 * 32].view(-1, 4, 32)
    assert not q.is_contiguous()
    check(batch, q=q)


def test_a_block_id_outside_the_cache_is_refused():
    q, k_cache, v_cache, tables, starts, lens = make_batch([1], [20])
    tables[0, 1] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_ops.paged_attention(q, k_cache, v_cache, tables, starts, lens, 0.125)


def test_other_dtypes_use_the_reference():
    q, k_cache, v_cache, tables, starts, lens = make_batch([1, 6], [9, 6], head_dim=32)
    clean = [t.nan_to_num(0.0).half() for t in (q, k_cache, v_cache)]
    tables = torch.where(tables == GARBAGE_BLOCK, 0, tables)
    got = cpu_ops.paged_attention(*clean, tables, starts, lens, 0.2)
    want = reference.paged_attention(*clean, tables, starts, lens, 0.2)
    assert torch.equal(got, want)


def test_scores_spread_far_apart_as_with_an_attention_sink():
    # q scaled up: scores span hundreds, so most probabilities underflow next to the largest one
    q, k_cache, v_cache, tables, starts, lens = make_batch([1, 24], [300, 24], seed=5)
    check((q * 40, k_cache, v_cache, tables, starts, lens))


def test_bf16_attention_runs_on_amx_where_the_cpu_has_it():
    # the tests above then check the AMX path (every bf16 item: decode rows and chunks) against the reference
    from bulkrun_kernels.cpu_build import cpu_flags

    if not {"amx_tile", "amx_bf16"} <= cpu_flags() or os.environ.get("BULKRUN_CPU_AMX") == "0":
        pytest.skip("no AMX on this CPU, or BULKRUN_CPU_AMX=0 turned it off")
    assert torch.ops.bulkrun_cpu.attention_amx()


@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_bf16_long_prompt_chunks_with_cached_context(head_dim):
    # many 16-row blocks and 32-key chunks per item, odd key-group counts, GQA groups that split blocks
    for seed, heads in enumerate([(9, 3), (8, 8), (10, 2)]):
        check(
            make_batch([97, 33, 1], [161, 290, 40], heads=heads, head_dim=head_dim, seed=seed),
            dtype=torch.bfloat16,
        )
