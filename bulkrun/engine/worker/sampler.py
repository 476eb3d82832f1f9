"""Per-request sampling: greedy, temperature, top-k, top-p, min-p, and log-probabilities.

Reproducibility: a seeded request's draw for output index j uses one uniform number that is a pure
function of (seed, j), turned into a token by inverse-CDF over the request's own filtered distribution.
So its tokens never depend on batch mates, and a preempted request that recomputes draws the same
numbers again. Unseeded requests draw from one per-engine generator.

Filtering follows transformers' order: temperature, then top-k, then top-p, then min-p. Top-k/top-p
rows work on their top candidates (topk, not a full sort of the vocabulary: a full sort costs ~5 ms a
row here); a top-p row whose candidates hold less than top_p of the mass retries with 8x as many, up
to the whole vocabulary, on its own (so its result never depends on its batch mates).

Log-probabilities are those of the model's own distribution: log_softmax of the raw logits, before
temperature and filtering (what an evaluator wants, and the same whatever the sampling settings).
"""

from __future__ import annotations

import random

import torch

from bulkrun.engine.core.params import SamplingParams

TOP_P_CANDIDATES = 1024  # first guess at how many tokens a top-p row needs


def draw_uniform(seed: int, output_index: int) -> float:
    """The uniform number behind output token `output_index` of a request seeded with `seed`."""
    return random.Random(_mix(seed, output_index)).random()


def _mix(seed: int, index: int) -> int:
    """splitmix64 of (seed, index): nearby seeds and indexes give unrelated streams."""
    x = (seed * 0x9E3779B97F4A7C15 + index + 1) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class Sampler:
    def __init__(self, seed: int | None = None):
        self._rng = random.Random(seed)  # for unseeded requests

    def __call__(
        self, logits: torch.Tensor, params: list[SamplingParams], output_indices: list[int]
    ) -> tuple[list[int], dict[int, float]]:
        """logits [N, V] fp32, one row per request -> (tokens, {row: logprob} for rows asking for it)."""
        tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        if len(greedy) == len(params):
            tokens = logits.argmax(dim=-1)
        elif greedy:
            rows = torch.tensor(greedy, device=logits.device)
            tokens.index_copy_(0, rows, logits.index_select(0, rows).argmax(dim=-1))
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        vocab = logits.shape[1]
        for (_, width), rows in _group_by_candidates(sampled, params, vocab).items():
            uniform = {i: self._uniform(params[i], output_indices[i]) for i in rows}  # one draw per row
            while rows:  # top-p rows whose candidates hold too little mass retry with 8x as many
                chosen, narrow = _sample_rows(
                    logits, rows, [params[i] for i in rows], [uniform[i] for i in rows], width
                )
                done = [j for j, n in enumerate(narrow) if not n]
                if done:
                    index = torch.tensor(done, device=logits.device)
                    target = torch.tensor([rows[j] for j in done], device=logits.device)
                    tokens.index_copy_(0, target, chosen.index_select(0, index))
                rows, width = [rows[j] for j, n in enumerate(narrow) if n], min(vocab, width * 8)
        return tokens.tolist(), _logprobs(logits, tokens, params)

    def _uniform(self, p: SamplingParams, output_index: int) -> float:
        return self._rng.random() if p.seed is None else draw_uniform(p.seed, output_index)


def _group_by_candidates(rows: list[int], params: list[SamplingParams], vocab: int) -> dict[tuple, list[int]]:
    """Rows keyed by (has top-k, how many top candidates they sample from; vocab: all)."""
    groups: dict[tuple, list[int]] = {}
    for i in rows:
        p = params[i]
        width = p.top_k if p.top_k > 0 else (TOP_P_CANDIDATES if p.top_p < 1.0 else vocab)
        groups.setdefault((p.top_k > 0, min(width, vocab)), []).append(i)
    return groups


def _sample_rows(logits, rows, params, uniforms, width) -> tuple[torch.Tensor, list[bool]]:
    """Tokens for `rows` from their top `width` candidates, and which rows need more candidates."""
    device = logits.device
    vocab = logits.shape[1]
    temperature = torch.tensor([p.temperature for p in params], device=device)[:, None]
    scaled = logits.index_select(0, torch.tensor(rows, device=device)) / temperature
    if width == vocab:
        values, ids = scaled, None
    else:
        values, ids = scaled.topk(width, dim=-1)
    narrow = [False] * len(rows)
    if any(p.top_p < 1.0 for p in params):
        values, ids, narrow = _top_p(scaled, values, ids, params)
    values = _min_p(values, [p.min_p for p in params])
    cdf = values.softmax(dim=-1).cumsum(dim=-1)
    u = torch.tensor(uniforms, dtype=cdf.dtype, device=device)[:, None] * cdf[:, -1:]
    position = torch.searchsorted(cdf, u, right=True).clamp_(max=values.shape[1] - 1)
    return (position.squeeze(1) if ids is None else ids.gather(1, position).squeeze(1)), narrow


def _top_p(scaled, values, ids, params):
    """Mask candidates beyond each row's top-p nucleus (rows without top-k see the whole vocabulary).

    Also says which rows' candidates hold less than top_p of the mass (their nucleus may go further).
    """
    top_p = torch.tensor([p.top_p for p in params], device=values.device)[:, None]
    if ids is None:
        values, ids = scaled.sort(dim=-1, descending=True)
    no_top_k = torch.tensor([p.top_k == 0 for p in params], device=values.device)[:, None]
    # Probabilities relative to the distribution top-p sees: the whole vocabulary without top-k.
    norm = torch.where(no_top_k, scaled.logsumexp(-1, keepdim=True), values.logsumexp(-1, keepdim=True))
    probs = (values - norm).exp()
    narrow = no_top_k & (probs.sum(-1, keepdim=True) < top_p) & (values.shape[1] < scaled.shape[1])
    outside = (probs.cumsum(dim=-1) - probs) >= top_p  # mass strictly above a token already >= top_p
    return values.masked_fill(outside, float("-inf")), ids, narrow.squeeze(1).tolist()


def _min_p(values: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Drop tokens less likely than min_p times the most likely one (a ratio: order-free)."""
    if not any(mp > 0 for mp in min_p):
        return values
    threshold = torch.tensor(min_p, device=values.device).log()[:, None]  # log 0 = -inf: no mask
    return values.masked_fill(values < values.max(dim=-1, keepdim=True).values + threshold, float("-inf"))


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]) -> dict[int, float]:
    rows = [i for i, p in enumerate(params) if p.logprobs]
    if not rows:
        return {}
    index = torch.tensor(rows, device=logits.device)
    picked = tokens.index_select(0, index)[:, None]
    values = logits.index_select(0, index).log_softmax(dim=-1).gather(1, picked).squeeze(1)
    return dict(zip(rows, values.tolist(), strict=True))
