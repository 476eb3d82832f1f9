"""Constrained against unconstrained generation in the engine, same prompts, default model.

Prints generated tokens per second of both runs and their ratio (what constraints cost), and the mask
cost: llguidance's fill time per token per sequence (on a GPU on a side thread while the forward runs;
on the CPU before the forward, on the step's own thread) and what the step waited for after its
forward. Today's figures: docs/benchmarks.md.

    flock /tmp/bulkrun-bench.lock .venv/bin/python bench/constrained_throughput.py [--rows 32] [--max-tokens 64] [--repeats 3]

Both runs generate the same number of tokens per row (ignore_eos for the free run, the grammar's own
end for the constrained one, which then counts its real tokens), greedy. The box is shared: read the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bulkrun.engine.structured_output import grammar
from bulkrun.engine.structured_output import step_masks as grammar_step
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.load import load_engine
from bulkrun.engine.structured_output.grammar import ConstraintSpec
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.model_source import resolve_model

SCHEMA = Path(__file__).resolve().parents[1] / "jobs" / "schemas" / "support-ticket.json"
TOPICS = ["a late parcel", "a double charge", "a broken zip", "a lost password", "a wrong size", "a refund"]


class MaskClock:
    """Wraps the fill and the join: total fill seconds, rows filled, seconds the step waited."""

    def __init__(self) -> None:
        self.fill_s = self.wait_s = 0.0
        self.rows = 0
        fill, fill_here = grammar.MaskFiller.fill, grammar.MaskFiller.fill_here
        wait = grammar_step.StepMasks._mask

        def timed(fill):
            def timed_fill(filler, matchers, bitmask):
                t = time.perf_counter()
                fill(filler, matchers, bitmask)
                self.fill_s += time.perf_counter() - t
                self.rows += len(matchers)

            return timed_fill

        def timed_wait(masks):
            t = time.perf_counter()
            out = wait(masks)
            self.wait_s += time.perf_counter() - t
            return out

        grammar.MaskFiller.fill, grammar.MaskFiller.fill_here = timed(fill), timed(fill_here)
        grammar_step.StepMasks._mask = timed_wait


def prompts(engine: Engine, rows: int) -> list[list[int]]:
    tok = engine.tokenizer
    texts = [
        f"Write a customer support ticket about {TOPICS[i % len(TOPICS)]} (#{i}) as JSON."
        for i in range(rows)
    ]
    return [
        list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                     return_dict=False))
        for t in texts
    ]  # fmt: skip


def run(engine: Engine, ids: list[list[int]], params: SamplingParams) -> tuple[int, float]:
    """One run on a cold prefix cache (a fresh Engine over the loaded model), so neither run reuses
    the other's prompt blocks."""
    engine = Engine(engine.runner, engine.config)
    requests = [EngineRequest(str(i), p, params) for i, p in enumerate(ids)]
    t = time.perf_counter()
    outputs = engine.generate(requests)
    return sum(len(o.output_token_ids) for o in outputs), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each (medians compared)")
    args = ap.parse_args()
    engine = load_engine(str(resolve_model(None)))
    spec = ConstraintSpec.json_schema(json.loads(SCHEMA.read_text()))
    ids = prompts(engine, args.rows)
    constrained = SamplingParams(max_tokens=args.max_tokens, constraint=spec)
    free = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    run(engine, ids[:2], constrained)  # warm-up: grammar tokenizer, compile, first steps
    run(engine, ids[:2], free)
    clock = MaskClock()
    free_runs, constrained_runs = [], []
    for _ in range(args.repeats):  # alternated, so a slow minute of the shared box hits both
        free_runs.append(run(engine, ids, free))
        constrained_runs.append(run(engine, ids, constrained))
    free_tokens, free_s = free_runs[0][0], statistics.median(s for _, s in free_runs)
    tokens, seconds = constrained_runs[0][0], statistics.median(s for _, s in constrained_runs)
    free_rate, rate = free_tokens / free_s, tokens / seconds
    print(f"rows {args.rows}, max_tokens {args.max_tokens}, schema {SCHEMA.name}, median of {args.repeats}")
    print(f"unconstrained  {free_tokens:6d} tokens  {free_s:7.2f} s  {free_rate:8.1f} tok/s")
    print(f"constrained    {tokens:6d} tokens  {seconds:7.2f} s  {rate:8.1f} tok/s")
    print(f"ratio constrained/unconstrained throughput: {rate / free_rate:.2f}x")
    per = 1e3 * clock.fill_s / max(clock.rows, 1)
    waited = 1e3 * clock.wait_s / max(clock.rows, 1)
    print(
        f"mask fill per token per sequence: {per:.3f} ms; the step waited {waited:.3f} ms of it after the forward"
    )


if __name__ == "__main__":
    main()
