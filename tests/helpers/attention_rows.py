"""One sequence's query rows attended three ways: as one chunk among other sequences, as 7-token
chunks, and each row alone as a decode step. A batch invariant attention gives them the same bits."""

from __future__ import annotations

import torch

CONTEXT, QUERIES, BLOCK = 70, 40, 16  # the sequence's last QUERIES tokens are the queries
HEADS, KV_HEADS, HEAD_DIM = 6, 2, 32


def _cache(dtype, device, heads, kv_heads, head_dim):
    g = torch.Generator().manual_seed(0)
    blocks = 2 * (-(-CONTEXT // BLOCK)) + 2
    k = torch.randn(blocks, BLOCK, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(blocks, BLOCK, kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(QUERIES, heads, head_dim, generator=g).to(dtype)
    other_q = torch.randn(9, heads, head_dim, generator=g).to(dtype)
    mine = torch.arange(-(-CONTEXT // BLOCK), dtype=torch.int32).flip(0)  # scattered: reversed order
    theirs = torch.arange(len(mine), 2 * len(mine), dtype=torch.int32)
    return [t.to(device) for t in (k, v, q, other_q, mine, theirs)]


def three_ways(attention, dtype, device, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(rows as one chunk in a mixed batch, rows as 7-token chunks, each row alone) for
    attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, **kwargs)."""
    k, v, q, other_q, mine, theirs = _cache(dtype, device, heads, kv_heads, head_dim)
    scale = head_dim**-0.5
    i32 = dict(dtype=torch.int32, device=device)

    def call(qs, lens, tables, starts):
        width = max(t.numel() for t in tables)
        table = torch.zeros(len(tables), width, **i32)
        for i, t in enumerate(tables):
            table[i, : t.numel()] = t
        qsl = torch.tensor([0, *torch.tensor(starts).cumsum(0).tolist()], **i32)
        return attention(torch.cat(qs), k, v, table, qsl, torch.tensor(lens, **i32), scale, **kwargs)

    # the chunk between a decode row and another sequence's 8-token chunk
    mixed = call([other_q[:1], q, other_q[1:]], [20, CONTEXT, 50], [theirs, mine, theirs], [1, QUERIES, 8])
    chunk_rows = mixed[1 : 1 + QUERIES]
    first = CONTEXT - QUERIES
    chunks = [
        call([q[s : s + 7]], [first + min(s + 7, QUERIES)], [mine], [min(7, QUERIES - s)])
        for s in range(0, QUERIES, 7)
    ]
    alone = [call([q[i : i + 1]], [first + i + 1], [mine], [1]) for i in range(QUERIES)]
    return chunk_rows, torch.cat(chunks), torch.cat(alone)
