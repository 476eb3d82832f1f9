"""`bulkrun plan`: a job's figures before it runs, measured the way the job would meet them.

The input goes through the job's own input pipeline (job/pipeline.py: reader, the id rule,
PromptBuilder, Feed, on the job's model and tokenizer), so rows, bad rows by kind and prompt tokens
are the job's own. Nothing is written to OUT. The first `sample` good rows then run on the engine
(Engine.stream, the job's one loop) to measure generated tokens per request and the engine's
throughput on this machine; plan_estimate turns the figures into the estimate (see its docstring).

Memory is bounded as in a job: a window at a time, prompt lengths as a histogram, the shared prefix as
one list, and only the sample's requests kept.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

from bulkrun.engine.core.outputs import StepStats
from bulkrun.job.feed import Feed, Prepared
from bulkrun.job.pipeline import input_pipeline, resolve_ids
from bulkrun.job.plan_estimate import (
    PlanEstimate,
    PlanInputs,
    PromptTokenStats,
    SampleRun,
    StepTiming,
    estimate_plan,
)
from bulkrun.job.prices import load_prices
from bulkrun.job.session import load_engine, resolve_model
from bulkrun.job.slices import parse_shard
from bulkrun.job.spec import JobSpec
from bulkrun.job.validate import check_input

DEFAULT_SAMPLE = 32


def plan_job(spec: JobSpec, *, sample: int = DEFAULT_SAMPLE, prices: Path | None = None) -> PlanEstimate:
    """Read the input as `spec`'s job would, run a sample of `sample` rows (0: none), estimate."""
    price_table = load_prices(prices) if prices is not None else ()  # a bad table stops us before work
    task, input_path, fmt = check_input(spec)  # the job's own checks, before any work
    model_path, _ = resolve_model(spec)
    engine = load_engine(spec, model_path)
    ids = resolve_ids(spec, input_path, fmt)["field"]  # the ids the job would record
    _, feed = input_pipeline(spec, task, engine, fmt=fmt, id_field=ids)
    start = time.perf_counter()
    prompts, errors, first = _read(feed, sample, quiet=spec.quiet)
    read_seconds = time.perf_counter() - start
    run = sample_run(engine, first) if first else None
    per_token = _kv_bytes_per_token(engine)
    pool = getattr(engine, "pool", None)  # None: an encoder engine keeps no KV cache
    return estimate_plan(
        PlanInputs(
            prompts=prompts,
            errors_by_kind=dict(errors),
            max_tokens=spec.max_tokens,
            n=spec.n,
            sample=run,
            workers=_workers(spec),
            block_size=pool.block_size if pool is not None else 16,
            prefix_cache=spec.enable_prefix_caching and pool is not None,
            kv_bytes_per_token=per_token,
            kv_available_bytes=pool.num_blocks * pool.block_size * per_token if pool is not None else None,
            max_seqs=engine.limits.max_num_seqs,
            token_budget=engine.limits.max_num_batched_tokens,
            read_seconds=read_seconds,
            prices=price_table,
        )
    )


def _read(feed: Feed, sample: int, quiet: bool) -> tuple[PromptTokenStats, Counter, list[Prepared]]:
    """Every row through the feed: prompt-length figures, bad rows by kind, the first `sample` rows."""
    from tqdm import tqdm

    prompts, errors, first = PromptTokenStats(), Counter(), []
    bar = tqdm(unit="row", desc="plan", file=sys.stderr, disable=quiet, dynamic_ncols=True)
    try:
        for window in feed.windows():
            errors.update(record["kind"] for record in window.errors)
            for prepared in window.prepared:
                prompts.add(prepared.requests[0].prompt_token_ids)
                if len(first) < sample:
                    first.append(prepared)
            bar.update(len(window.errors) + len(window.prepared))
    finally:
        feed.close()
        bar.close()
    return prompts, errors, first


def sample_run(engine, prepared: list[Prepared]) -> SampleRun:
    """Run the rows' requests through the engine as a job does, and measure them."""
    requests = []
    for p in prepared:
        for k, request in enumerate(p.requests):
            request.request_id = f"{p.item.index}/{k}"
            requests.append(request)
    prompt = cached = 0
    lengths: list[int] = []
    steps: list[StepTiming] = []
    start = last = time.perf_counter()

    def timed(stats: StepStats) -> None:  # each step's shape and the time since the previous one
        nonlocal last
        now = time.perf_counter()
        steps.append(StepTiming(stats.num_prefill_tokens, stats.num_decode_tokens, now - last))
        last = now

    for output in engine.stream(iter(requests), on_step=timed):
        prompt += len(output.prompt_token_ids)
        cached += output.num_cached_tokens
        lengths.append(len(output.output_token_ids))
    return SampleRun(
        len(requests), prompt, cached, sum(lengths), time.perf_counter() - start, tuple(steps), tuple(lengths)
    )


def _workers(spec: JobSpec) -> int:
    """Processes sharing the job: --workers (Ray) or the N of --shard K/N."""
    if spec.workers:
        return spec.workers
    if spec.shard is not None:
        return parse_shard(spec.shard).count
    return 1


def _kv_bytes_per_token(engine) -> int:
    """K and V of one token over all layers, as the engine's cache stores them."""
    cache = getattr(engine.runner, "kv_cache", None)
    if cache is None:  # an encoder: nothing is cached between steps
        return 0
    return cache.data[:, :, :1, :1].numel() * cache.data.element_size()
