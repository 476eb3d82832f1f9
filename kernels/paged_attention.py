"""Paged attention for a mixed batch (decode rows and prompt chunks) in one Triton launch.

Layout: one program per (query block, kv head). A query block holds up to BLOCK_Q consecutive query
tokens of ONE sequence, times the GROUP query heads that share the kv head (GQA), so BLOCK_M =
BLOCK_Q * GROUP rows share every K/V tile they load. The program walks the sequence's context through
its block table in tiles of TILE_N keys with an online softmax (fp32, exp2).

The grid size comes from shapes only (T // BLOCK_Q + B: an upper bound on the query blocks of all
sequences), and each program finds its sequence by binary search over query_start_loc, so the launch
needs no host sync and can be captured in a CUDA graph. Surplus programs exit at once.

Split-KV (flash-decoding): when those programs are too few to fill the device, or a context is long,
a third grid axis cuts every context into `num_partitions` pieces (sized per sequence inside the
kernel, so the host needs no lengths); each writes its un-normalised output, max and sum to fp32
scratch and _reduce_partitions_kernel combines them. The partition count is a runtime argument, so
every count shares one binary.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ._checks import (
    FLOAT_DTYPES,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_runnable,
    check_same_device,
)


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block_idx, num_seqs, BLOCK_Q: tl.constexpr):
    # Sequence s owns query blocks starting at query_start_loc[s] // BLOCK_Q + s; find the last s
    # whose first block is <= q_block_idx.
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# Integers that change from step to step are not specialized on (Triton would otherwise compile a new
# binary whenever one of them is 1 or a multiple of 16): one binary per variant for a whole run.
@triton.jit(do_not_specialize=["num_seqs", "num_partitions", "num_tokens", "stride_bt", "window"])
def _paged_attention_kernel(
    out_ptr,
    partial_ptr,  # SPLIT: [T, Hq, P, HEAD_DIM_PAD] fp32 un-normalised outputs of each partition
    stats_ptr,  # SPLIT: [2, T, Hq, P] fp32 running max (log2 units) and sum of each partition
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    sinks_ptr,  # HAS_SINKS: [Hq] fp32, one logit per query head in the softmax denominator
    scale_log2,  # softmax scale * log2(e): the kernel uses exp2
    window,  # > 0: each query sees its last `window` keys (itself included); 0: all earlier keys
    softcap,  # SOFTCAP: scores = softcap * tanh(scores / softcap)
    num_seqs,
    num_partitions,
    num_tokens,
    num_q_heads,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    q_block_idx = tl.program_id(0)
    kv_head = tl.program_id(1)
    partition = tl.program_id(2)
    seq = _find_seq_idx(query_start_loc_ptr, q_block_idx, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_block = q_block_idx - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= q_len:
        return  # surplus program of the upper-bound grid
    context_len = tl.load(seq_lens_ptr + seq)

    # Row r is query token r // GROUP of this block, head kv_head * GROUP + r % GROUP.
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q_idx = local_block * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (q_idx < q_len)
    d_ok = offs_d < HEAD_DIM
    q_pos = context_len - q_len + q_idx  # absolute position: causal limit of each row
    tok = (q_start + q_idx).to(tl.int64)
    q_offs = tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:  # the sink is one more softmax term, exp(sink - m): start the running max there
        if partition == 0:  # (once per row: the split partitions' sums are added up)
            m_i = tl.load(sinks_ptr + head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
            l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)

    # Keys visible to the last query of this block; later keys are never needed, nor (with a window)
    # keys before the first query's window. The tiles are shared out evenly over the partitions from
    # each sequence's own length (no host-side lengths needed), so no partition lies outside the window.
    kv_len = context_len - q_len + tl.minimum(q_len, (local_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_len, TILE_N)
    first_key = tl.maximum(context_len - q_len + local_block * BLOCK_Q - window + 1, 0)
    window_tile = tl.where(window > 0, first_key // TILE_N, 0)
    tiles_per_partition = tl.cdiv(num_tiles - window_tile, num_partitions)
    first_tile = window_tile + partition * tiles_per_partition
    last_tile = tl.minimum(first_tile + tiles_per_partition, num_tiles)
    # the first key each row sees (0 without a window)
    row_first = tl.where(window > 0, q_pos - window + 1, 0)
    offs_n = tl.arange(0, TILE_N)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(first_tile, last_tile):
        k_pos = tile * TILE_N + offs_n
        k_ok = k_pos < kv_len
        block = tl.load(table_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot = (k_pos % BLOCK_SIZE).to(tl.int64)
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k_offs = block[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh
        k = tl.load(k_cache_ptr + k_offs + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        if SOFTCAP:  # in log2 units: cap * tanh(x / cap) with x = s ln 2, tanh by exp2
            e = tl.math.exp2(s * (2.0 / softcap))  # exp(2 x / cap)
            s = (softcap * 1.4426950408889634) * (1.0 - 2.0 / (e + 1.0))
        visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= row_first[:, None]) & k_ok[None, :]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows with nothing visible yet
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_offs = block[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
        v = tl.load(v_cache_ptr + v_offs + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_IN_FP32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if SPLIT:  # this partition's share; _reduce_partitions_kernel combines them
        row = (tok * num_q_heads + head) * num_partitions + partition
        p_offs = row[:, None] * HEAD_DIM_PAD + offs_d[None, :]
        tl.store(partial_ptr + p_offs, acc, mask=row_ok[:, None])
        tl.store(stats_ptr + row, m_i, mask=row_ok)
        stats_stride = num_tokens.to(tl.int64) * num_q_heads * num_partitions
        tl.store(stats_ptr + stats_stride + row, l_i, mask=row_ok)
    else:
        acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_offs = tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["num_partitions", "num_tokens"])
def _reduce_partitions_kernel(
    out_ptr,
    partial_ptr,
    stats_ptr,
    num_partitions,
    num_tokens,
    num_q_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    MAX_PARTITIONS: tl.constexpr,
):
    # One program per (token, query head): the partitions' softmax pieces rescaled to a common max.
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row0 = (tok * num_q_heads + head) * num_partitions
    stats_stride = num_tokens.to(tl.int64) * num_q_heads * num_partitions
    offs_p = tl.arange(0, MAX_PARTITIONS)
    p_ok = offs_p < num_partitions
    m = tl.load(stats_ptr + row0 + offs_p, mask=p_ok, other=float("-inf"))
    m_max = tl.max(m, axis=0)
    m_safe = tl.where(m_max > float("-inf"), m_max, 0.0)  # no visible key at all (padding rows)
    weight = tl.math.exp2(m - m_safe)  # 0 for empty partitions
    l_i = tl.load(stats_ptr + stats_stride + row0 + offs_p, mask=p_ok, other=0.0)
    total = tl.sum(l_i * weight, axis=0)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    parts = tl.load(
        partial_ptr + (row0 + offs_p)[:, None] * HEAD_DIM_PAD + offs_d[None, :], mask=p_ok[:, None], other=0.0
    )
    acc = tl.sum(parts * weight[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + offs_d, acc.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)  # fmt: skip


def _interpreted() -> bool:
    return type(_paged_attention_kernel).__name__ == "InterpretedFunction"


# Split-KV (flash-decoding) sizing. A program walks one query block's context for one kv head; when
# there are fewer of them than a few per SM, or one context is long enough to leave its program
# running alone at the end, each context is cut into partitions run side by side and combined by
# _reduce_partitions_kernel.
MAX_PARTITIONS = 32  # also the reduce kernel's tile height
MIN_PARTITION_KEYS = 256  # a partition shorter than this costs more in the reduce than it saves
LONG_PARTITION_KEYS = 4096  # no decode program walks more than this (when the scratch budget allows)
PROGRAMS_PER_SM = 4
SCRATCH_BYTES = 64 << 20  # cap on the partials' fp32 scratch (a CUDA graph keeps it for its lifetime)
CPU_SM_COUNT = 132  # what the interpreter plans for: an H100/H200, so the CPU tests take the GPU's paths


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan_partitions(
    num_tokens: int, num_seqs: int, block_q: int, num_kv_heads: int, context_bound: int,
    row_bytes: int, num_sms: int,
) -> int:  # fmt: skip
    """How many partitions each context is split into (1: no split). Shapes and static numbers only,
    so the answer is fixed for a captured CUDA graph and needs no host sync.

    context_bound: no sequence has more keys (block-table width * block size); row_bytes: one query
    token's fp32 partial output (heads * padded head_dim * 4)."""
    programs = max(num_seqs, -(-num_tokens // block_q)) * num_kv_heads
    by_occupancy = -(-PROGRAMS_PER_SM * num_sms // programs) if programs < PROGRAMS_PER_SM * num_sms else 1
    # Prompt chunks bring programs enough and uneven (causal) work anyway: only decode rows are cut
    # for length.
    prefill_heavy = num_tokens >= 8 * max(num_seqs, 1)
    by_length = 1 if prefill_heavy else -(-context_bound // LONG_PARTITION_KEYS)
    wanted = min(max(by_occupancy, by_length), -(-context_bound // MIN_PARTITION_KEYS), MAX_PARTITIONS)
    affordable = SCRATCH_BYTES // max(1, num_tokens * row_bytes)
    return max(1, min(wanted, affordable))


def _pick_blocks(num_tokens: int, num_seqs: int, group: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_Q, TILE_N) from shapes only: small query blocks when decode rows dominate."""
    prefill_heavy = num_tokens >= 8 * max(num_seqs, 1)
    block_m = max(64 if prefill_heavy else 16, triton.next_power_of_2(group))
    tile_n = 64 if prefill_heavy else 32
    return block_m, block_m // group, tile_n


def _check_args(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out) -> None:
    check_ndim("q", q, 3, "[num_tokens, num_q_heads, head_dim]")
    check_ndim("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    check_ndim("v_cache", v_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    check_ndim("block_tables", block_tables, 2, "[num_seqs, max_blocks_per_seq]")
    check_ndim("query_start_loc", query_start_loc, 1, "[num_seqs + 1]")
    check_ndim("seq_lens", seq_lens, 1, "[num_seqs]")
    check_dtype("q", q, FLOAT_DTYPES)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} dtype {t.dtype} differs from q dtype {q.dtype}")
    for name, t in (
        ("block_tables", block_tables),
        ("query_start_loc", query_start_loc),
        ("seq_lens", seq_lens),
    ):
        check_dtype(name, t, (torch.int32,))
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[3]} differs from q head_dim {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"batch sizes disagree: seq_lens has {num_seqs}, query_start_loc {query_start_loc.shape[0]} "
            f"(needs {num_seqs + 1}), block_tables {block_tables.shape[0]} rows"
        )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        check_last_dim_contiguous(name, t)
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(
            f"out must match q ({tuple(q.shape)}, {q.dtype}), got {tuple(out.shape)}, {out.dtype}"
        )
    check_same_device(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        **({"out": out} if out is not None else {}),
    )


def _check_extras(q, window, sinks, softcap) -> None:
    if int(window) < 0:
        raise ValueError(f"window must be >= 0 (0: no window), got {window}")
    if softcap < 0.0:
        raise ValueError(f"softcap must be >= 0 (0: off), got {softcap}")
    if sinks is not None and (
        sinks.shape != (q.shape[1],) or sinks.dtype != torch.float32 or not sinks.is_contiguous()
    ):
        raise ValueError(
            f"sinks must be a contiguous float32 [{q.shape[1]}] tensor, got {tuple(sinks.shape)} {sinks.dtype}"
        )
    if sinks is not None:
        check_same_device(q=q, sinks=sinks)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    softcap: float = 0.0,
    out: torch.Tensor | None = None,
    num_partitions: int | None = None,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole cached context.

    q[T, Hq, D]: the step's queries, packed; sequence s owns rows query_start_loc[s]:query_start_loc[s+1].
    seq_lens[s]: context length including this step's tokens (whose K/V must already be in the cache);
    query i of a chunk of length n sits at position seq_lens[s] - n + i. Returns [T, Hq, D] (into `out`
    when given, e.g. a static buffer of a CUDA graph). num_partitions: split-KV partitions (None: chosen
    from the shapes by plan_partitions; 1: no split); capture-safe either way (no host sync).
    window / sinks / softcap: a layer's sliding window, attention sinks and score soft-cap, as in
    ATTENTION_SIGNATURE.md; the window is a runtime argument (every window shares one binary).
    batch_invariant: query and key tiles fixed (the decode-sized ones) and no split-KV unless
    num_partitions asks for it, so a row's keys are reduced in one fixed order whatever the step holds.
    """
    _check_args(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out)
    _check_extras(q, window, sinks, softcap)
    check_runnable(_paged_attention_kernel, q.device)
    num_tokens, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_q_heads // num_kv_heads
    if batch_invariant:  # the tiles a decode step picks, whatever this step holds; no split-KV
        block_m, block_q, tile_n = _pick_blocks(1, 1, group)
        num_partitions = 1 if num_partitions is None else num_partitions
    else:
        block_m, block_q, tile_n = _pick_blocks(num_tokens, num_seqs, group)
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    if num_partitions is None:
        num_partitions = plan_partitions(num_tokens, num_seqs, block_q, num_kv_heads,
                                         block_tables.shape[1] * block_size, num_q_heads * head_dim_pad * 4,
                                         _sm_count(q.device))  # fmt: skip
    if not 1 <= num_partitions <= MAX_PARTITIONS:
        raise ValueError(f"num_partitions must be in 1..{MAX_PARTITIONS}, got {num_partitions}")
    split = num_partitions > 1
    if split:
        partials = torch.empty(num_tokens, num_q_heads, num_partitions, head_dim_pad, dtype=torch.float32,
                               device=q.device)  # fmt: skip
        stats = torch.empty(2, num_tokens, num_q_heads, num_partitions, dtype=torch.float32, device=q.device)
    else:
        partials = stats = out  # unused by the unsplit variant
    grid = (num_tokens // block_q + num_seqs, num_kv_heads, num_partitions)
    _paged_attention_kernel[grid](
        out, partials, stats, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
        q if sinks is None else sinks, scale * math.log2(math.e), max(0, int(window)), float(softcap), num_seqs, num_partitions, num_tokens, num_q_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        BLOCK_SIZE=block_size,
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=tile_n,
        SPLIT=split,
        HAS_SINKS=sinks is not None,
        SOFTCAP=softcap > 0.0,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        # Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584).
        DOT_IN_FP32=q.dtype == torch.bfloat16 and _interpreted(),
    )  # fmt: skip
    if split:
        _reduce_partitions_kernel[(num_tokens, num_q_heads)](
            out, partials, stats, num_partitions, num_tokens, num_q_heads, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=head_dim_pad,
            MAX_PARTITIONS=MAX_PARTITIONS,
        )  # fmt: skip
    return out
