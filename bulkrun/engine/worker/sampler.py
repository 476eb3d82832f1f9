"""Per-request sampling: greedy, temperature, top-k, top-p, min-p, and log-probabilities.

Reproducibility: a seeded request's draw for output index j uses one uniform number that is a pure
function of (seed, j), turned into a token by inverse-CDF over the request's own filtered distribution.
So its tokens never depend on batch mates, and a preempted request that recomputes draws the same
numbers again. Unseeded requests draw from one per-engine generator.

Filtering follows transformers' order: temperature, then top-k, then top-p, then min-p. Top-k rows
work on their top k candidates. A top-p row without top-k sorts its whole vocabulary on a GPU; on the
CPU (where a full-vocabulary sort costs milliseconds a row) it first tries its top candidates and, when they hold less
than top_p of the mass, retries with 8x as many, up to the whole vocabulary, on its own (so its result
never depends on its batch mates). Every parameter and draw reaches the device through Staging, and
the results stay there: a GPU step samples without the host waiting.

Log-probabilities are those of the model's own distribution: log_softmax of the raw logits, before
temperature and filtering (what an evaluator wants, and the same whatever the sampling settings).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.worker.staging import Staging

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


@dataclass(slots=True)
class Sampled:
    """One step's draws, on the device: a token per row, and the model's log-probability of it for
    the rows in `logprob_rows` (in that order; None when no row asks)."""

    tokens: torch.Tensor
    logprob_rows: list[int]
    logprobs: torch.Tensor | None


class Sampler:
    def __init__(self, seed: int | None = None, staging: Staging | None = None, widen_on_host: bool = True):
        """widen_on_host: a top-p row without top-k first tries its top TOP_P_CANDIDATES tokens and
        widens when they hold too little mass, which reads a device result on the host: right on the
        CPU (host and device are one, and a full sort of the vocabulary costs ~5 ms a row), never on
        a GPU, where such a row sorts its whole vocabulary at once and nothing waits."""
        self._rng = random.Random(seed)  # for unseeded requests
        self._staging = staging or Staging(torch.device("cpu"))
        self._widen_on_host = widen_on_host

    def __call__(
        self, logits: torch.Tensor, params: list[SamplingParams], output_indices: list[int]
    ) -> Sampled:
        """logits [N, V] fp32, one row per request; everything stays on the device."""
        stage = self._staging.to_device
        greedy = [i for i, p in enumerate(params) if p.greedy]
        if len(greedy) == len(params):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
        if greedy and len(greedy) < len(params):
            rows = stage(greedy, torch.int64)
            tokens.index_copy_(0, rows, logits.index_select(0, rows).argmax(dim=-1))
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        vocab = logits.shape[1]
        widen = self._widen_on_host
        for (_, width), rows in _group_by_candidates(sampled, params, vocab, widen).items():
            uniform = {i: self._uniform(params[i], output_indices[i]) for i in rows}  # one draw per row
            while rows:  # (widen_on_host) top-p rows whose candidates hold too little mass: 8x as many
                chosen, narrow = _sample_rows(
                    logits, stage(rows, torch.int64), [params[i] for i in rows], [uniform[i] for i in rows],
                    width, stage,
                )  # fmt: skip
                if narrow is None:  # every row drew from a sufficient candidate set
                    tokens.index_copy_(0, stage(rows, torch.int64), chosen)
                    break
                narrow = narrow.tolist()  # the host reads the device: only where they are one
                done = [j for j, n in enumerate(narrow) if not n]
                if done:
                    target = stage([rows[j] for j in done], torch.int64)
                    tokens.index_copy_(0, target, chosen.index_select(0, stage(done, torch.int64)))
                rows, width = [rows[j] for j, n in enumerate(narrow) if n], min(vocab, width * 8)
        rows = [i for i, p in enumerate(params) if p.logprobs]
        return Sampled(tokens, rows, _logprobs(logits, tokens, stage(rows, torch.int64)) if rows else None)

    def _uniform(self, p: SamplingParams, output_index: int) -> float:
        return self._rng.random() if p.seed is None else draw_uniform(p.seed, output_index)


def _group_by_candidates(
    rows: list[int], params: list[SamplingParams], vocab: int, widen: bool
) -> dict[tuple, list[int]]:
    """Rows keyed by (has top-k, how many top candidates they sample from; vocab: all)."""
    first_guess = TOP_P_CANDIDATES if widen else vocab
    groups: dict[tuple, list[int]] = {}
    for i in rows:
        p = params[i]
        width = p.top_k if p.top_k > 0 else (first_guess if p.top_p < 1.0 else vocab)
        groups.setdefault((p.top_k > 0, min(width, vocab)), []).append(i)
    return groups


def _sample_rows(logits, rows, params, uniforms, width, stage) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens for `rows` (a device index) from their top `width` candidates, and (on the device)
    which rows need more candidates: None when none can (every candidate set is sufficient)."""
    vocab = logits.shape[1]
    temperature = stage([p.temperature for p in params], torch.float32)[:, None]
    scaled = logits.index_select(0, rows) / temperature
    if width == vocab:
        values, ids = scaled, None
    else:
        values, ids = scaled.topk(width, dim=-1)
    narrow = None
    if any(p.top_p < 1.0 for p in params):
        values, ids, narrow = _top_p(scaled, values, ids, params, stage)
    values = _min_p(values, [p.min_p for p in params], stage)
    cdf = row_cumsum(values.softmax(dim=-1))
    u = stage(uniforms, torch.float32).to(cdf.dtype)[:, None] * cdf[:, -1:]
    position = torch.searchsorted(cdf, u, right=True).clamp_(max=values.shape[1] - 1)
    return (position.squeeze(1) if ids is None else ids.gather(1, position).squeeze(1)), narrow


def row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Cumulative sums along each row of x [N, V], each row's order the same whatever N is.

    On CUDA torch scans a one-row tensor with CUB's device-wide scan and a many-row one row by row:
    two summation orders. Over a 128k vocabulary their rounding differs by about one token's
    probability, so a sampled row alone and the same row beside others would draw different
    tokens. A lone row is scanned beside a copy of itself, so it always takes the row-by-row scan."""
    if x.shape[0] == 1 and x.is_cuda:
        return x.expand(2, -1).cumsum(dim=-1)[:1]
    return x.cumsum(dim=-1)


def _top_p(scaled, values, ids, params, stage):
    """Mask candidates beyond each row's top-p nucleus (rows without top-k see the whole vocabulary).

    Also says (a device bool per row; None when the candidates are the whole vocabulary) which rows'
    candidates hold less than top_p of the mass (their nucleus may go further).
    """
    top_p = stage([p.top_p for p in params], torch.float32)[:, None]
    if ids is None:
        values, ids = scaled.sort(dim=-1, descending=True)
    no_top_k = stage([p.top_k == 0 for p in params], torch.bool)[:, None]
    # Probabilities relative to the distribution top-p sees: the whole vocabulary without top-k.
    norm = torch.where(no_top_k, scaled.logsumexp(-1, keepdim=True), values.logsumexp(-1, keepdim=True))
    probs = (values - norm).exp()
    narrow = None  # a top-k row's candidates are all it may draw from: it never widens
    if values.shape[1] < scaled.shape[1] and any(p.top_k == 0 for p in params):
        narrow = (no_top_k & (probs.sum(-1, keepdim=True) < top_p)).squeeze(1)
    outside = (row_cumsum(probs) - probs) >= top_p  # mass strictly above a token already >= top_p
    return values.masked_fill(outside, float("-inf")), ids, narrow


def _min_p(values: torch.Tensor, min_p: list[float], stage) -> torch.Tensor:
    """Drop tokens less likely than min_p times the most likely one (a ratio: order-free)."""
    if not any(mp > 0 for mp in min_p):
        return values
    threshold = stage(min_p, torch.float32).log()[:, None]  # log 0 = -inf: no mask
    return values.masked_fill(values < values.max(dim=-1, keepdim=True).values + threshold, float("-inf"))


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The model's log-probability of each of `rows`' tokens (a device index), on the device."""
    picked = tokens.index_select(0, rows)[:, None]
    return logits.index_select(0, rows).log_softmax(dim=-1).gather(1, picked).squeeze(1)
