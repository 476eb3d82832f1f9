"""The CPU fast-path ops (bulkrun_kernels.reference) against obvious per-token implementations."""

from __future__ import annotations

import pytest
import torch

from bulkrun_kernels import reference as ref


def _naive_attention(q, k_cache, v_cache, tables, query_lens, seq_lens, scale):
    """One query at a time over an explicitly built slot list: slow and obviously right."""
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    out, row = torch.empty_like(q), 0
    for table, n, context in zip(tables, query_lens, seq_lens, strict=True):
        slots = [table[p // block_size] * block_size + p % block_size for p in range(context)]
        k = k_cache.flatten(0, 1)[slots].repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_cache.flatten(0, 1)[slots].repeat_interleave(group, dim=1)
        for i in range(n):
            pos = context - n + i
            scores = torch.einsum("hd,lhd->hl", q[row], k[: pos + 1]) * scale
            out[row] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v[: pos + 1])
            row += 1
    return out


def _random_batch(query_lens, seq_lens, num_kv_heads, group, head_dim=16, block_size=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_needed) + 40
    perm = torch.randperm(num_blocks, generator=gen).tolist()  # shuffled: tables are not contiguous
    perm.remove(num_blocks - 1)
    perm.insert(0, num_blocks - 1)  # the largest block index is in use
    tables, used = [], 0
    for nb in blocks_needed:
        tables.append(perm[used : used + nb])
        used += nb
    width = max(blocks_needed)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    kv_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(kv_shape, generator=gen), torch.randn(kv_shape, generator=gen)
    q = torch.randn(sum(query_lens), num_kv_heads * group, head_dim, generator=gen)
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return q, k_cache, v_cache, tables, block_tables, starts, torch.tensor(seq_lens, dtype=torch.int32)


# (query_lens, seq_lens): decode rows (query length 1) of many lengths, so several decode groups with
# padding masks; chunks with and without earlier context; a chunk shorter than a block.
MIXED_BATCHES = [
    ([1] * 19, [5, 9, 1, 33, 17, 17, 4, 8, 12, 2, 30, 31, 7, 6, 21, 3, 16, 15, 11]),
    ([7, 1, 12, 1, 1, 3], [7, 20, 30, 1, 9, 3]),
    ([5, 1, 2, 1], [13, 13, 6, 13]),
    ([9], [9]),
]


@pytest.mark.parametrize("query_lens,seq_lens", MIXED_BATCHES)
@pytest.mark.parametrize("num_kv_heads,group", [(2, 3), (1, 4), (3, 1)])
def test_paged_attention_matches_naive(query_lens, seq_lens, num_kv_heads, group):
    q, k_cache, v_cache, tables, block_tables, starts, lens = _random_batch(
        query_lens, seq_lens, num_kv_heads, group
    )
    expected = _naive_attention(q, k_cache, v_cache, tables, query_lens, seq_lens, scale=0.3)
    out = torch.full_like(q, float("nan"))  # poisoned: an unwritten row fails
    got = ref.paged_attention(q, k_cache, v_cache, block_tables, starts, lens, 0.3, out=out)
    assert got is out
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_paged_attention_plan_is_reusable_across_layers():
    q, k_cache, v_cache, _, block_tables, starts, lens = _random_batch(*MIXED_BATCHES[1], 2, 2)
    plan = ref.plan_attention(block_tables, starts, lens, k_cache.shape[1], q.dtype)
    first = ref.paged_attention(q, k_cache, v_cache, block_tables, starts, lens, 0.5, plan=plan)
    k2, v2 = torch.randn_like(k_cache), torch.randn_like(v_cache)
    second = ref.paged_attention(q, k2, v2, block_tables, starts, lens, 0.5, plan=plan)
    torch.testing.assert_close(
        first, ref.paged_attention(q, k_cache, v_cache, block_tables, starts, lens, 0.5)
    )
    torch.testing.assert_close(second, ref.paged_attention(q, k2, v2, block_tables, starts, lens, 0.5))


def test_a_plan_from_host_tables_lives_on_the_device_it_is_made_for():
    """A GPU runner plans from its host copies of the step's tables (no device read) and runs the plan
    on its device: every index and mask of the plan must be there ("meta" stands in for CUDA)."""
    q, k_cache, _, _, block_tables, starts, lens = _random_batch(*MIXED_BATCHES[1], 2, 2)
    plan = ref.plan_attention(block_tables, starts, lens, k_cache.shape[1], q.dtype, torch.device("meta"))
    tensors = [t for g in plan.decode_groups for t in (g.rows, g.blocks, g.positions, g.mask)]
    tensors += [t for c in plan.chunks for t in (c.blocks, c.mask)]
    assert plan.decode_groups and plan.chunks
    assert {t.device.type for t in tensors if t is not None} == {"meta"}


def test_write_kv_writes_slots_and_skips_negative():
    k_cache, v_cache = torch.zeros(6, 4, 2, 8), torch.zeros(6, 4, 2, 8)
    k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    slots = torch.tensor([23, 0, -1, 9])
    ref.write_kv(k, v, k_cache, v_cache, slots)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k_cache[slot // 4, slot % 4], k[t])
            assert torch.equal(v_cache[slot // 4, slot % 4], v[t])
    assert int((k_cache.abs().sum(-1) != 0).sum()) == 3 * 2  # nothing else was touched


def test_rms_norm_with_and_without_residual():
    x, residual, weight = torch.randn(5, 32), torch.randn(5, 32), torch.randn(32)

    def naive(h):
        return weight * (h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))

    out, same = ref.rms_norm(x, weight, 1e-6)
    assert same is x
    torch.testing.assert_close(out, naive(x))
    out, summed = ref.rms_norm(x, weight, 1e-6, residual=residual)
    torch.testing.assert_close(summed, x + residual)
    torch.testing.assert_close(out, naive(x + residual))


def test_rotary_matches_complex_rotation():
    head_dim, positions = 8, torch.tensor([0, 5, 17])
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(32).float(), inv_freq)
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    q, k = torch.randn(3, 4, head_dim), torch.randn(3, 2, head_dim)

    def naive(x):  # pairs (i, i + D/2) rotated by angle pos * inv_freq[i], as a complex product
        z = torch.complex(x[..., : head_dim // 2], x[..., head_dim // 2 :])
        z = z * torch.polar(torch.ones_like(angles[positions]), angles[positions])[:, None, :]
        return torch.cat((z.real, z.imag), dim=-1)

    got_q, got_k = ref.rotary(q, k, positions, cache)
    torch.testing.assert_close(got_q, naive(q))
    torch.testing.assert_close(got_k, naive(k))
    q_in_place = q.clone()
    ref.rotary(q_in_place, k.clone(), positions, cache, q_out=q_in_place)
    torch.testing.assert_close(q_in_place, naive(q))


def test_partial_rotary_rotates_the_leading_dims_only():
    q, k, positions = torch.randn(3, 4, 16), torch.randn(3, 2, 16), torch.tensor([0, 5, 17])
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, 12, 2).float() / 12))
    angles = torch.outer(torch.arange(32).float(), inv_freq)
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)  # 12 of 16 dims
    got_q, got_k = ref.rotary(q, k, positions, cache)
    whole_q, whole_k = ref.rotary(q[..., :12].contiguous(), k[..., :12].contiguous(), positions, cache)
    assert torch.equal(got_q[..., :12], whole_q) and torch.equal(got_k[..., :12], whole_k)
    assert torch.equal(got_q[..., 12:], q[..., 12:]) and torch.equal(got_k[..., 12:], k[..., 12:])
    q_out = torch.full_like(q, float("nan"))
    ref.rotary(q, k, positions, cache, q_out=q_out)
    assert torch.equal(q_out, got_q)


def test_silu_and_mul():
    x = torch.randn(3, 10)
    torch.testing.assert_close(ref.silu_and_mul(x), torch.nn.functional.silu(x[:, :5]) * x[:, 5:])
