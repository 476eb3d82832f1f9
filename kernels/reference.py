"""Plain-PyTorch versions of the hot ops: the CPU fast path, and what every Triton kernel must equal.

Signatures match the Triton wrappers beside this file (out= arguments are accepted and honoured).
Layouts: q/k/v [T, heads, D] packed over all sequences of a step; KV cache [num_blocks, block_size,
Hkv, D]; block_tables [B, max_blocks] int32; query_start_loc [B+1] int32; seq_lens [B] int32 (context
length including this step's tokens); slot_mapping [T] int64 (slot = block * block_size + offset).

Attention on the CPU is bound by memory traffic, not arithmetic: gathering every sequence's paged K/V
into one padded batch triples the bytes moved. So decode rows are grouped a few sequences at a time
(sorted by context length, so there is little padding) and each group's K/V is gathered and used while
it is still in cache; prompt chunks go one sequence at a time. The grouping is an AttentionPlan, built
once per step (plan_attention) and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .moe_routing import clamped_swiglu, combine, sort_by_expert

# Sequences per decode group: small enough that a group's gathered K/V stays in the CPU cache
# (4 x 400 tokens x 3 heads x 64 x 4 B x 2 = 2.5 MB), large enough to amortise the per-call overhead.
# Measured (48 sequences, one thread): groups of 2-6 within noise of each other, 12+ clearly slower.
DECODE_GROUP_SIZE = 4


@dataclass(slots=True)
class DecodeGroup:
    rows: torch.Tensor  # [n] int64: the query row (one per sequence, query length 1)
    blocks: torch.Tensor  # [n * num_blocks] int64: each sequence's first num_blocks block ids
    num_blocks: int
    context: int  # keys to attend over after the gather (the group's longest context)
    mask: torch.Tensor | None  # [n, 1, 1, context] additive (0 / -inf); None when all lengths match
    positions: torch.Tensor  # [n] int64: each row's position (its sequence's length - 1)


@dataclass(slots=True)
class ChunkWork:
    start: int  # query rows start:end of the packed q
    end: int
    blocks: torch.Tensor  # [num_blocks] int64
    context: int  # seq_len: keys 0..context-1
    mask: torch.Tensor | None  # [n, context] additive causal-with-offset mask; None -> plain causal


@dataclass(slots=True)
class AttentionPlan:
    decode_groups: list[DecodeGroup]
    chunks: list[ChunkWork]


def plan_attention(
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | None = None,
) -> AttentionPlan:
    """Split a step's sequences into decode groups and chunks (one host read of the lengths).
    device: where the plan's index tensors and masks go (default: the block table's); a runner
    plans from its host copies of the step's tables and runs the plan on its device."""
    device = block_tables.device if device is None else torch.device(device)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    decodes, chunks = [], []
    for s, ctx in enumerate(lens):
        n = starts[s + 1] - starts[s]
        if n == 1:
            decodes.append(s)
        elif n > 1:
            chunks.append(_plan_chunk(block_tables[s], starts[s], n, ctx, block_size, dtype, device))
    decodes.sort(key=lambda s: lens[s], reverse=True)
    groups = [
        _plan_decode_group(
            block_tables, decodes[i : i + DECODE_GROUP_SIZE], starts, lens, block_size, dtype, device
        )
        for i in range(0, len(decodes), DECODE_GROUP_SIZE)
    ]
    return AttentionPlan(decode_groups=groups, chunks=chunks)


def _plan_decode_group(block_tables, seqs, starts, lens, block_size, dtype, device) -> DecodeGroup:
    group_lens = [lens[s] for s in seqs]
    context = max(group_lens)
    num_blocks = -(-context // block_size)
    seq_idx = torch.tensor(seqs, dtype=torch.long, device=block_tables.device)
    blocks = block_tables.index_select(0, seq_idx)[:, :num_blocks].reshape(-1).long().to(device)
    mask = None
    if min(group_lens) != context:
        keys = torch.arange(context, device=device)
        too_far = keys[None, :] >= torch.tensor(group_lens, device=device)[:, None]
        mask = torch.zeros(len(seqs), 1, 1, context, dtype=dtype, device=device)
        mask.masked_fill_(too_far[:, None, None, :], float("-inf"))
    rows = torch.tensor([starts[s] for s in seqs], dtype=torch.long, device=device)
    positions = torch.tensor(group_lens, dtype=torch.long, device=device) - 1
    return DecodeGroup(rows, blocks, num_blocks, context, mask, positions)


def _plan_chunk(table, start, n, context, block_size, dtype, device) -> ChunkWork:
    num_blocks = -(-context // block_size)
    blocks = table[:num_blocks].long().to(device)
    mask = None
    if context != n:  # earlier context: query i sits at position context - n + i
        positions = torch.arange(context - n, context, device=device)
        too_far = torch.arange(context, device=device)[None, :] > positions[:, None]
        mask = torch.zeros(n, context, dtype=dtype, device=device).masked_fill_(too_far, float("-inf"))
    return ChunkWork(start=start, end=start + n, blocks=blocks, context=context, mask=mask)


def _gather(cache: torch.Tensor, blocks: torch.Tensor, num_seqs: int, context: int) -> torch.Tensor:
    """[num_seqs, Hkv, context, D] strided view of the sequences' blocks, copied once."""
    num_blocks_total, block_size, num_heads, head_dim = cache.shape
    rows = cache.view(num_blocks_total, -1).index_select(0, blocks)
    return rows.view(num_seqs, -1, num_heads, head_dim)[:, :context].transpose(1, 2)


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
    plan: AttentionPlan | None = None,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its cached context (GQA). [T, Hq, D].

    window > 0: the query at position p sees keys max(0, p - window + 1) .. p only. sinks [Hq] fp32:
    one extra logit per head in the softmax denominator (its column then dropped). softcap > 0:
    scores = softcap * tanh(scores / softcap) before the mask. See ATTENTION_SIGNATURE.md.

    batch_invariant: a row's bits depend on the row alone (_attend_invariant, in fp32); False: torch's
    SDPA per decode group and chunk, whose blocking follows the step's shapes (faster)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    if plan is None:
        plan = plan_attention(block_tables, query_start_loc, seq_lens, k_cache.shape[1], q.dtype)
    if out is None:
        out = torch.empty_like(q)
    plain = window <= 0 and sinks is None and softcap <= 0.0
    extras = _Extras(window, sinks, softcap, num_kv_heads, group)
    for g in plan.decode_groups:
        n = g.rows.numel()
        qg = q.index_select(0, g.rows).view(n, num_kv_heads, group, head_dim)
        k = _gather(k_cache, g.blocks, n, g.context)
        v = _gather(v_cache, g.blocks, n, g.context)
        if batch_invariant:
            o = _tiled_rows(qg, k, v, g.positions, scale, extras).to(out.dtype)
        elif plain:
            o = _sdpa(qg, k, v, g.mask, scale=scale)
        else:  # q [n, Hkv, group, 1, D] against k [n, Hkv, 1, context, D]
            positions = g.positions.view(n, 1, 1, 1, 1)
            o = extras.attend(qg.unsqueeze(-2), k.unsqueeze(2), v.unsqueeze(2), positions, scale)
        out.index_copy_(0, g.rows, o.reshape(n, num_q_heads, head_dim))
    for c in plan.chunks:
        k = _gather(k_cache, c.blocks, 1, c.context)
        v = _gather(v_cache, c.blocks, 1, c.context)
        n = c.end - c.start
        if batch_invariant:
            qc = q[c.start : c.end].view(n, num_kv_heads, group, head_dim)
            positions = torch.arange(c.context - n, c.context, device=q.device)
            o = _tiled_rows(qc, k, v, positions, scale, extras)
            out[c.start : c.end] = o.reshape(n, num_q_heads, head_dim)
        elif plain:
            qc = q[c.start : c.end].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            o = _sdpa(qc, k, v, c.mask, is_causal=c.mask is None, scale=scale, enable_gqa=group > 1)
            out[c.start : c.end] = o[0].transpose(0, 1)
        else:  # q [Hkv, group, n, D] against k [Hkv, 1, context, D]
            qc = q[c.start : c.end].view(n, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
            positions = torch.arange(c.context - n, c.context, device=q.device)[:, None]
            o = extras.attend(qc, k[0].unsqueeze(1), v[0].unsqueeze(1), positions, scale)
            out[c.start : c.end] = o.permute(2, 0, 1, 3).reshape(n, num_q_heads, head_dim)
    return out


# Keys per tile of the batch invariant attention: every product is over one tile, so its shape never
# follows the step's (a context is padded with masked keys to whole tiles).
KEY_TILE = 64
ROW_SLICE = 64  # query rows per pass (bounds the [rows, Hkv, tiles, group, KEY_TILE] scores)


def _tiled_rows(q, k, v, positions, scale: float, extras: _Extras) -> torch.Tensor:
    """The batch invariant attention: q [n, Hkv, group, D] over k/v [n or 1, Hkv, context, D];
    positions [n] -> [n, Hkv, group, D] fp32. Every row over its own keys with arithmetic no other row
    changes: scores and value sums as matmuls of fixed shape (group x D by D x KEY_TILE, group x
    KEY_TILE by KEY_TILE x D) per key tile, tiles then added in order (a sequential cumsum: padding
    tiles add exact zeros), fixed-size sums within a tile, and exp / tanh from plain IEEE operations
    (torch's own exp takes another code path for the elements at a thread's chunk boundary, whose
    place follows the tensor's size)."""
    n, hkv, group, head_dim = q.shape
    tiles = -(-k.shape[2] // KEY_TILE)
    pad = tiles * KEY_TILE - k.shape[2]
    kt = (
        F.pad(k.float(), (0, 0, 0, pad))
        .view(k.shape[0], hkv, tiles, KEY_TILE, head_dim)
        .transpose(-1, -2)
        .contiguous()
    )
    vt = F.pad(v.float(), (0, 0, 0, pad)).view(v.shape[0], hkv, tiles, KEY_TILE, head_dim)
    keys = torch.arange(tiles * KEY_TILE, device=q.device).view(tiles, 1, KEY_TILE)
    sink = None
    if extras.sinks is not None:
        sink = extras.sinks.float().view(1, hkv, 1, group, 1)
    out = torch.empty(n, hkv, group, head_dim, dtype=torch.float32, device=q.device)
    for r0 in range(0, n, ROW_SLICE):
        r1 = min(n, r0 + ROW_SLICE)
        ks, vs = (kt, vt) if kt.shape[0] == 1 else (kt[r0:r1], vt[r0:r1])
        qs = q[r0:r1].float().contiguous().unsqueeze(2)  # one layout whatever q is a view of
        scores = torch.matmul(qs, ks) * scale  # [s, Hkv, tiles, group, KEY_TILE]
        if extras.softcap > 0.0:
            scores = _exact_tanh(scores / extras.softcap) * extras.softcap
        scores = scores.masked_fill(
            ~extras.visible(keys, positions[r0:r1].view(-1, 1, 1, 1, 1)), float("-inf")
        )
        top = scores.amax(dim=(2, 4), keepdim=True)  # exact, whatever the order
        if sink is not None:
            top = torch.maximum(top, sink)
        probs = _exact_exp(scores - top)  # masked keys: exactly 0
        total = probs.sum(-1).cumsum(2)[:, :, -1]  # [s, Hkv, group]
        sums = torch.matmul(probs, vs).cumsum(2)[:, :, -1]  # [s, Hkv, group, D]
        if sink is not None:
            total = total + _exact_exp(sink - top)[:, :, 0, :, 0]
        out[r0:r1] = sums / total.unsqueeze(-1)
    return out


def _exact_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for x <= 0 from IEEE adds and multiplies (Cephes expf, as kernels/cpu/vec_math.h), so each
    element's bits are its own whatever path torch runs it on; below -87 exactly 0."""
    xc = x.clamp(min=-87.0)
    n = torch.floor(xc * 1.44269504088896341 + 0.5)
    r = xc - n * 0.693359375
    r = r - n * -2.12194440e-4
    p = torch.full_like(r, 1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + c
    y = p * r * r + r + 1.0
    scale = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return torch.where(x > -87.0, y * scale, torch.zeros_like(y))


def _exact_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh(x) = sign(x) (1 - e) / (1 + e) with e = e^-2|x| from _exact_exp (no overflow)."""
    e = _exact_exp(-2.0 * x.abs())
    return torch.sign(x) * ((1.0 - e) / (1.0 + e))


@dataclass(slots=True)
class _Extras:
    """A layer's window / sinks / softcap: attention written out in fp32 (SDPA has no sinks or softcap)."""

    window: int
    sinks: torch.Tensor | None
    softcap: float
    num_kv_heads: int
    group: int

    def visible(self, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Which keys a query at each position sees: causal, and within the window if there is one."""
        seen = keys <= positions
        return seen & (keys > positions - self.window) if self.window > 0 else seen

    def attend(self, q, k, v, positions, scale) -> torch.Tensor:
        """q [..., Hkv, group, n, D] x k/v [..., Hkv, 1, context, D]; positions broadcast to the
        scores' [..., n, 1] (each query row's position). Returns q's shape, in q's dtype."""
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        if self.softcap > 0.0:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        keys = torch.arange(k.shape[-2], device=q.device)
        scores = scores.masked_fill(~self.visible(keys, positions), float("-inf"))
        if self.sinks is not None:
            sink = self.sinks.float().view(self.num_kv_heads, self.group, 1, 1)
            scores = torch.cat((scores, sink.expand(*scores.shape[:-1], 1)), dim=-1)
        probs = torch.softmax(scores, dim=-1)
        if self.sinks is not None:
            probs = probs[..., :-1]
        return torch.matmul(probs, v.float()).to(q.dtype)


def _sdpa(q, k, v, mask, **kwargs) -> torch.Tensor:
    """SDPA; bf16/fp16 on the CPU computed in fp32. PyTorch's reduced-precision CPU attention JIT-
    compiles a brgemm kernel for every new sequence length and never frees one: a job of 200,000
    rows of varied lengths grew by 740 MB that way (bench/job_bench.py, a model this path serves)."""
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    o = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=None if mask is None else mask.float(), **kwargs
    )
    return o.to(q.dtype)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k_cache[slot // block_size, slot % block_size] = k[t] (same for v), for every t with slot >= 0."""
    if k.shape[0] == 0:
        return
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    num_heads, head_dim = k.shape[1:]
    k_cache.view(-1, num_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual) * weight, x + residual); with residual None the second result is x itself.

    Computed in float32 and cast back before the weight, as transformers' LlamaRMSNorm does.
    """
    if residual is not None:
        x = torch.add(x, residual, out=residual_out) if residual_out is not None else x + residual
    h = x.float()
    variance = h.pow(2).mean(-1, keepdim=True)
    normed = weight * (h * torch.rsqrt(variance + eps)).to(x.dtype)
    if out is not None:
        out.copy_(normed)
        normed = out
    return normed, x


def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half (NeoX/Llama) rotary embedding; cos_sin_cache[row] = [cos(pos*f) | sin(pos*f)],
    [rows, R], `positions` each token's row. The rotation covers each head's first R dims (R <= D:
    partial rotary); the others pass through unchanged.

    Returns new tensors, or writes into q_out / k_out when given (they may be q / k themselves).
    """
    cos, sin = cos_sin_cache.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)  # [T, 1, R/2]
    return _rotate(q, cos, sin, q_out), _rotate(k, cos, sin, k_out)


def _rotate(x, cos, sin, out):
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    first = (x1 * cos - x2 * sin).to(x.dtype)
    second = (x2 * cos + x1 * sin).to(x.dtype)
    if out is None:
        return torch.cat((first, second, rest), dim=-1)
    if out is not x and rest.shape[-1]:
        out[..., 2 * half :] = rest
    out[..., :half] = first
    out[..., half : 2 * half] = second
    return out


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x[T, 2I] (gate then up, as a fused gate_up projection yields) -> silu(gate) * up, [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return torch.mul(F.silu(gate), up, out=out) if out is not None else F.silu(gate) * up


def gelu_tanh_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x[T, 2I] (gate then up) -> gelu(gate, tanh approximation) * up, [T, I]: GeGLU (Gemma)."""
    gate, up = x.chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh")
    return torch.mul(act, up, out=out) if out is not None else act * up


def fused_moe(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    activation: str = "silu",
    *,
    b_gate_up: torch.Tensor | None = None,
    b_down: torch.Tensor | None = None,
    swiglu: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixture-of-experts MLP: out[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]), each
    expert down(act(gate) * up) with w_gate_up [E, 2I, H] and w_down [E, H, I]. Tokens sorted by
    expert, one matmul per non-empty expert over its gathered rows (moe_routing). b_gate_up [E, 2I] /
    b_down [E, H]: expert biases; swiglu (alpha, limit): gpt-oss's clamped SwiGLU instead of
    `activation`. Returns (out [T, H], tokens per expert [E])."""
    num_experts, k = w_gate_up.shape[0], topk_ids.shape[1]
    order, counts, offsets = sort_by_expert(topk_ids, num_experts)
    rows = x.index_select(0, order // k)
    y = torch.empty(rows.shape[0], w_down.shape[1], dtype=x.dtype, device=x.device)
    act = gelu_tanh_and_mul if activation == "gelu_tanh" else silu_and_mul
    if swiglu is not None:
        act = lambda h: clamped_swiglu(h, *swiglu)  # noqa: E731
    bounds = offsets.tolist()
    for e in range(num_experts):
        start, end = bounds[e], bounds[e + 1]
        if start < end:
            bias_up = None if b_gate_up is None else b_gate_up[e]
            bias_down = None if b_down is None else b_down[e]
            h = act(F.linear(rows[start:end], w_gate_up[e], bias_up))
            y[start:end] = F.linear(h, w_down[e], bias_down)
    return combine(y, order, topk_weights, x.dtype), counts
