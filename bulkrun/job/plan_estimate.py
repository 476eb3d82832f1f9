"""What `bulkrun plan` prints: a job's figures estimated before it runs, from plain numbers.

The caller (the plan command) reads the input as the job would and feeds every good prompt's token ids
to PromptTokenStats, counts bad rows by kind, optionally runs a short sample on the engine and
measures it (SampleRun), and hands all of it to estimate_plan(). Nothing here reads files, tokenizes
or touches the engine, so every figure is a pure function of its inputs and unit-tested as such.

Estimation model (stated so the bench can check it):
- prefix cache: the engine reuses full blocks of the prefix shared by all prompts; the first request on
  each worker computes them, every later request skips them (never its last prompt token, as the engine
  always recomputes that one to get logits).
- generated tokens: the bound is requests x max_tokens; the estimate is requests x the sample's mean.
- wall time: the sample's steps, each timed with its shape (prefill tokens, decode rows), fit a step
  cost = fixed + per prefill token + per decode row (least squares, no negative terms; a decode row
  costs what a prompt token does unless the sample's decode steps vary enough to tell); the whole job
  is then simulated step by step as the scheduler runs it (decodes first, then prompt chunks, within
  the job's token budget and running-request cap) and the costs summed, divided over the workers, plus
  the time plan's own read pass took (the job reads and tokenizes the same rows). A sample run at 32
  requests thus predicts a job running 256 at once by its step shapes, not by one tokens/s figure.
  Without timed steps the sample's engine tokens per second is applied to the job's engine tokens.
- KV memory: the largest request must fit alone; a full batch of max_seqs average requests (sharing the
  prefix blocks) is what runs without preemption.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from bulkrun.job.prices import Cost, Price, costs

PERCENTILES = (50, 90, 99)


class PromptTokenStats:
    """Streaming prompt-length figures in memory bounded by the number of distinct lengths."""

    def __init__(self) -> None:
        self.lengths: Counter[int] = Counter()
        self.prefix: list[int] | None = None  # token ids every prompt so far starts with

    def add(self, token_ids: Sequence[int]) -> None:
        self.lengths[len(token_ids)] += 1
        if self.prefix is None:
            self.prefix = list(token_ids)
            return
        keep = 0
        for a, b in zip(self.prefix, token_ids, strict=False):
            if a != b:
                break
            keep += 1
        del self.prefix[keep:]

    @property
    def count(self) -> int:
        return sum(self.lengths.values())

    @property
    def total(self) -> int:
        return sum(length * k for length, k in self.lengths.items())

    @property
    def shared_prefix_len(self) -> int:
        return len(self.prefix or ())

    def percentile(self, q: float) -> int:
        """Nearest-rank percentile (q in 0..100) of the prompt lengths; 0 with no prompts."""
        count = self.count
        if count == 0:
            return 0
        rank, seen = max(1, math.ceil(q / 100 * count)), 0
        for length in sorted(self.lengths):
            seen += self.lengths[length]
            if seen >= rank:
                return length
        return max(self.lengths)


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One engine step of the sample: its shape (from StepStats) and how long it took."""

    prefill_tokens: int
    decode_rows: int
    seconds: float


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds of one engine step of a given shape."""

    fixed: float
    per_prefill_token: float
    per_decode_row: float

    def __call__(self, prefill_tokens: int, decode_rows: int) -> float:
        return self.fixed + self.per_prefill_token * prefill_tokens + self.per_decode_row * decode_rows


WARMUP_STEPS = 1  # the sample's first steps pay one-off costs (allocations, lazy init) a job pays once


def fit_step_cost(steps: Sequence[StepTiming]) -> StepCost | None:
    """Least-squares step cost with no negative term; None when fewer than 3 steps are left after the
    warm-up. A decode row's own cost can only be told from the fixed cost when the sample's decode
    steps vary in size; a sample whose rows all decode together (the common case: similar prompts,
    one max_tokens) cannot, and a free fit then splits them by noise (measured: per-row cost off 3x,
    which a job running 5x as many rows at once multiplies). There a decode row is costed as a
    prompt token (the same GEMM work per token), which the prompt chunks measure."""
    steps = list(steps[WARMUP_STEPS:])
    if len(steps) < 3:
        return None
    decode = sorted({s.decode_rows for s in steps if s.decode_rows})
    if len(decode) >= 3 and decode[-1] >= 2 * decode[0]:
        rows = [(1.0, float(s.prefill_tokens), float(s.decode_rows)) for s in steps]
        return StepCost(*_nonnegative_fit(rows, [s.seconds for s in steps]))
    rows = [(1.0, float(s.prefill_tokens + s.decode_rows)) for s in steps]
    fixed, per_token = _nonnegative_fit(rows, [s.seconds for s in steps])
    return StepCost(fixed, per_token, per_token)


def _nonnegative_fit(rows: list[tuple[float, ...]], y: list[float]) -> list[float]:
    """Least squares with no negative coefficient: exact NNLS over the subsets of the columns."""
    width = len(rows[0])
    best: tuple[float, list[float]] = (math.inf, [0.0] * width)
    for mask in range(1, 1 << width):
        used = [k for k in range(width) if mask >> k & 1]
        coef = _least_squares([[r[k] for k in used] for r in rows], y)
        if coef is None or any(c < 0 for c in coef):
            continue
        full = [0.0] * width
        for k, c in zip(used, coef, strict=True):
            full[k] = c
        residual = sum(
            (sum(f * x for f, x in zip(full, r, strict=True)) - t) ** 2 for r, t in zip(rows, y, strict=True)
        )
        if residual < best[0] - 1e-15:
            best = (residual, full)
    return best[1]


def _least_squares(x: list[list[float]], y: list[float]) -> list[float] | None:
    """Solve the normal equations (k <= 3 columns) by Gaussian elimination; None if singular."""
    k = len(x[0])
    a = [
        [sum(r[i] * r[j] for r in x) for j in range(k)] + [sum(r[i] * t for r, t in zip(x, y, strict=True))]
        for i in range(k)
    ]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        scale = max(abs(v) for row in a for v in row[:k]) or 1.0
        if abs(a[pivot][col]) <= 1e-12 * scale:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(k):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col], strict=True)]
    return [a[i][k] / a[i][i] for i in range(k)]


SIMULATED_REQUESTS = 4096  # beyond this many (and 4 full batches) the job's steady state is scaled up


def simulate_steps(
    prompt_tokens: Sequence[int], generated: Sequence[int], max_seqs: int, token_budget: int
) -> list[tuple[int, int]]:
    """(prefill tokens, decode rows) of every step the scheduler takes for these requests, all
    queued at once: running decodes first, then prompt chunks in admission order, new requests
    admitted while there is room. A request's last prompt chunk samples its first token, so a request
    generating g tokens takes g - 1 decode rows."""
    waiting = list(zip(prompt_tokens, generated, strict=True))[::-1]  # pop() takes the first
    running: list[list[int]] = []  # [prompt tokens left, tokens left to generate]
    steps = []
    while waiting or running:
        budget, prefill, decode = token_budget, 0, 0
        for req in running:
            if budget and req[0] == 0 and req[1] > 0:
                req[1] -= 1
                budget -= 1
                decode += 1
        while waiting and len(running) < max_seqs:
            prompt, gen = waiting.pop()
            running.append([max(prompt, 1), gen])
        for req in running:
            if budget <= 0:
                break
            if req[0] > 0:
                n = min(req[0], budget)
                req[0] -= n
                budget -= n
                prefill += n
                if req[0] == 0:
                    req[1] -= 1  # the last chunk samples the first token
        steps.append((prefill, decode))
        running = [r for r in running if r[0] > 0 or r[1] > 0]
    return steps


def simulated_seconds(
    cost: StepCost,
    requests: int,
    prompt_tokens: int,
    generated: Sequence[int],
    max_seqs: int,
    token_budget: int,
) -> float:
    """The job's engine time: `requests` of `prompt_tokens` computed prompt tokens in all (spread
    evenly), each generating like the sample's requests in turn, run under the job's limits."""
    if requests == 0:
        return 0.0
    simulated = min(requests, max(SIMULATED_REQUESTS, 4 * max_seqs))
    base, extra = divmod(prompt_tokens, requests)
    prompts = [base + (i < extra) for i in range(simulated)]
    gens = [max(generated[i % len(generated)], 1) if generated else 1 for i in range(simulated)]
    seconds = sum(cost(p, d) for p, d in simulate_steps(prompts, gens, max_seqs, token_budget))
    return seconds * requests / simulated


@dataclass(frozen=True, slots=True)
class SampleRun:
    """A short run of the job's first rows on the engine, as measured."""

    requests: int
    prompt_tokens: int
    cached_prompt_tokens: int  # prefix-cache hits: prompt tokens the engine did not compute
    generated_tokens: int
    seconds: float
    steps: tuple[StepTiming, ...] = ()  # every engine step of the sample, timed
    generated_lengths: tuple[int, ...] = ()  # tokens each request generated

    @property
    def engine_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prompt_tokens + self.generated_tokens

    @property
    def tokens_per_s(self) -> float:
        return self.engine_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_generated(self) -> float:
        return self.generated_tokens / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class PlanInputs:
    prompts: PromptTokenStats
    errors_by_kind: dict[str, int]
    max_tokens: int
    n: int = 1  # samples (requests) per row
    sample: SampleRun | None = None
    workers: int = 1
    block_size: int = 16
    prefix_cache: bool = True
    kv_bytes_per_token: int = 0  # the model's K+V bytes for one token over all layers
    kv_available_bytes: int | None = None  # the engine's KV budget on this machine
    max_seqs: int | None = None  # the engine's running-request cap (None: as many as rows)
    token_budget: int | None = None  # the engine's tokens per step (None: unbounded)
    read_seconds: float = 0.0  # plan's pass reading and tokenizing the input, which the job repeats
    prices: Sequence[Price] = ()


@dataclass
class PlanEstimate:
    rows: int
    good_rows: int
    errors_by_kind: dict[str, int]
    requests: int
    prompt_tokens: int  # over good rows, once per row (as the job's report counts them)
    prompt_percentiles: dict[str, int]  # p50 / p90 / p99 / max
    shared_prefix_tokens: int
    prefix_cache_saved_tokens: int
    generated_tokens_bound: int
    generated_tokens_estimate: int | None
    engine_tokens_per_s: float | None
    step_cost: dict | None  # the sample's fitted seconds per step: fixed, per prefill token, per decode row
    wall_seconds_estimate: float | None
    kv_bytes_largest_request: int
    kv_bytes_full_batch: int
    kv_bytes_available: int | None
    costs: list[dict] = field(default_factory=list)  # provider, model, as_of, usd (estimate), usd_bound

    def as_dict(self) -> dict:
        return asdict(self)


def cacheable_prefix(prompts: PromptTokenStats) -> int:
    """Prompt tokens of the shared prefix the engine can serve from its cache (whole blocks, then a
    block's leading tokens by copy), never the last token of the shortest prompt."""
    if prompts.count == 0:
        return 0
    return max(min(prompts.shared_prefix_len, min(prompts.lengths) - 1), 0)


def estimate_plan(inputs: PlanInputs) -> PlanEstimate:
    prompts, n = inputs.prompts, inputs.n
    good = prompts.count
    errors = sum(inputs.errors_by_kind.values())
    requests = good * n
    cached = cacheable_prefix(prompts) if inputs.prefix_cache else 0
    saved = cached * max(requests - max(inputs.workers, 1), 0)
    bound = requests * inputs.max_tokens
    generated = None
    if inputs.sample is not None:
        generated = min(bound, round(requests * inputs.sample.mean_generated))
    rate = inputs.sample.tokens_per_s if inputs.sample is not None else None
    cost = fit_step_cost(inputs.sample.steps) if inputs.sample is not None else None
    wall = _wall_seconds(inputs, cost, requests, prompts.total * n - saved, generated, rate)
    percentiles = {f"p{q}": prompts.percentile(q) for q in PERCENTILES}
    percentiles["max"] = max(prompts.lengths, default=0)
    largest, full = _kv_bytes(inputs, generated, cached)
    return PlanEstimate(
        rows=good + errors,
        good_rows=good,
        errors_by_kind=dict(sorted(inputs.errors_by_kind.items())),
        requests=requests,
        prompt_tokens=prompts.total,
        prompt_percentiles=percentiles,
        shared_prefix_tokens=prompts.shared_prefix_len,
        prefix_cache_saved_tokens=saved,
        generated_tokens_bound=bound,
        generated_tokens_estimate=generated,
        engine_tokens_per_s=rate,
        step_cost=asdict(cost) if cost is not None else None,
        wall_seconds_estimate=wall,
        kv_bytes_largest_request=largest,
        kv_bytes_full_batch=full,
        kv_bytes_available=inputs.kv_available_bytes,
        costs=_costs(inputs.prices, prompts.total * n, bound, generated),
    )


def _wall_seconds(
    inputs: PlanInputs,
    cost: StepCost | None,
    requests: int,
    computed_prompt: int,
    generated: int | None,
    rate: float | None,
) -> float | None:
    sample, workers = inputs.sample, max(inputs.workers, 1)
    if sample is None or not rate:
        return None
    if cost is None:  # no timed steps: one tokens/s figure
        return (computed_prompt + (generated or 0)) / rate / workers + inputs.read_seconds / workers
    per_worker = -(-requests // workers)
    lengths = [min(g, inputs.max_tokens) for g in sample.generated_lengths]
    engine = simulated_seconds(
        cost,
        per_worker,
        -(-computed_prompt // workers),
        lengths,
        inputs.max_seqs or per_worker or 1,
        inputs.token_budget or max(computed_prompt, 1),
    )
    return engine + inputs.read_seconds / workers


def _kv_bytes(inputs: PlanInputs, generated: int | None, cached: int) -> tuple[int, int]:
    prompts, block = inputs.prompts, inputs.block_size
    requests = prompts.count * inputs.n
    if requests == 0:
        return 0, 0
    per_token = inputs.kv_bytes_per_token
    largest = _blocks(max(prompts.lengths) + inputs.max_tokens, block) * block * per_token
    mean_generated = generated / requests if generated is not None else inputs.max_tokens
    mean_request = _blocks(math.ceil(prompts.total / prompts.count + mean_generated), block) * block
    running = min(inputs.max_seqs or requests, requests)
    whole = cached // block * block  # the prefix's whole blocks are held once, not per request
    shared = whole * (running - 1)
    return largest, max(running * mean_request - shared, 0) * per_token


def _blocks(tokens: int, block: int) -> int:
    return -(-tokens // block)


def _costs(prices: Sequence[Price], prompt: int, bound: int, generated: int | None) -> list[dict]:
    """Every priced model, cheapest first: the estimate where a sample ran, and the max_tokens bound.
    Token counts are this model's tokenizer's; a provider's tokenizer counts differently."""
    at_bound = {(c.provider, c.model): c for c in costs(list(prices), prompt, bound)}
    ranked: list[Cost] = (
        costs(list(prices), prompt, generated) if generated is not None else list(at_bound.values())
    )
    return [
        {
            "provider": c.provider,
            "model": c.model,
            "as_of": c.as_of.isoformat(),
            "usd": c.usd if generated is not None else None,
            "usd_bound": at_bound[(c.provider, c.model)].usd,
        }
        for c in ranked
    ]


def format_plan(plan: PlanEstimate) -> str:
    """The plan as the command prints it (one figure per line, for people)."""
    p = plan.prompt_percentiles
    errors = ", ".join(f"{kind} {count}" for kind, count in plan.errors_by_kind.items()) or "none"
    lines = [
        f"rows              {plan.rows:,} ({plan.good_rows:,} good; bad rows: {errors})",
        f"requests          {plan.requests:,}",
        f"prompt tokens     {plan.prompt_tokens:,} (p50 {p['p50']:,}, p90 {p['p90']:,}, p99 {p['p99']:,}, "
        f"max {p['max']:,})",
        f"shared prefix     {plan.shared_prefix_tokens:,} tokens; prefix cache saves "
        f"{plan.prefix_cache_saved_tokens:,} prompt tokens",
        f"generated tokens  at most {plan.generated_tokens_bound:,}"
        + (
            f", about {plan.generated_tokens_estimate:,} (sample)"
            if plan.generated_tokens_estimate is not None
            else ""
        ),
    ]
    if plan.wall_seconds_estimate is not None:
        lines.append(
            f"throughput        {plan.engine_tokens_per_s:,.1f} engine tokens/s on this machine (sample)"
        )
        if plan.step_cost is not None:
            c = plan.step_cost
            lines.append(
                f"step cost         {c['fixed'] * 1e3:,.1f} ms + {c['per_prefill_token'] * 1e3:,.3f} ms per prompt "
                f"token + {c['per_decode_row'] * 1e3:,.3f} ms per decode row (sample, fitted)"
            )
        lines.append(f"wall time         about {_duration(plan.wall_seconds_estimate)}")
    available = "unknown" if plan.kv_bytes_available is None else _size(plan.kv_bytes_available)
    lines.append(
        f"KV memory         largest request {_size(plan.kv_bytes_largest_request)}, full batch "
        f"{_size(plan.kv_bytes_full_batch)}; available {available}"
    )
    for c in plan.costs:
        estimate = f"about ${c['usd']:,.2f}, " if c["usd"] is not None else ""
        lines.append(
            f"cost              {c['provider']}/{c['model']}: {estimate}at most ${c['usd_bound']:,.2f} "
            f"(batch prices as of {c['as_of']})"
        )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _size(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    value = nbytes / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GiB"
