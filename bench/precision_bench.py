"""CPU precision benchmark: bulkrun's engine in bfloat16 against itself in float32, on the engine
bench's workload (48 chat prompts, 64 new tokens, greedy), in one process.

Variants: float32 (the reference), bfloat16 as it runs by default (residual stream in fp32) and
bfloat16 with its residual stream in bf16 as well (the two compared).
Speed: engine wall time of each, median of --repeats runs on a cold prefix cache.
Quality, against the fp32 run as reference:
  - greedy outputs identical to fp32's (count) and the mean common prefix (tokens);
  - mean |log p| difference of fp32's chosen tokens, scored teacher-forced under both precisions;
  - perplexity of a held-in text sample (the shipped tickets) under both;
  - classify labels (label scoring) equal to fp32's on the shipped tickets.

    .venv/bin/python bench/precision_bench.py [--prompts 48] [--max-new 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from importlib import resources

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import chat_prompts  # noqa: E402

from bulkrun.engine.core.config import EngineConfig  # noqa: E402
from bulkrun.engine.core.engine import Engine  # noqa: E402
from bulkrun.engine.load import load_engine  # noqa: E402
from bulkrun.engine.worker import loaded_model  # noqa: E402
from bulkrun.engine.core.params import EngineRequest, SamplingParams  # noqa: E402
from bulkrun.model_source import resolve_model  # noqa: E402

PPL_CHUNK = 512  # tokens per scored chunk of the text sample


def greedy(engine: Engine, prompts, max_new: int) -> tuple[float, list[list[int]]]:
    engine = Engine(engine.runner, engine.config)  # cold prefix cache
    params = SamplingParams(max_tokens=max_new)
    t0 = time.perf_counter()
    outs = engine.generate([EngineRequest(f"r{i}", p, params) for i, p in enumerate(prompts)])
    return time.perf_counter() - t0, [list(o.output_token_ids) for o in outs]


def score(engine: Engine, prompts, continuations) -> list[list[float]]:
    """Teacher-forced log-probabilities of each continuation after its prompt."""
    engine = Engine(engine.runner, engine.config)
    reqs = [
        EngineRequest(f"s{i}", p, continuations=[c])
        for i, (p, c) in enumerate(zip(prompts, continuations, strict=True))
        if c
    ]
    return [o.continuation_logprobs[0] for o in engine.generate(reqs)]


def text_chunks(tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """The shipped tickets' texts as one token stream, cut into PPL_CHUNK-token pieces: (first
    token, the rest) per piece, so every token but the first of each piece is scored."""
    lines = resources.files("bulkrun.data").joinpath("tickets.jsonl").read_text().splitlines()
    text = "\n\n".join(json.loads(ln)["text"] for ln in lines if ln.strip())
    ids = tokenizer(text)["input_ids"]
    pieces = [ids[i : i + PPL_CHUNK] for i in range(0, len(ids) - 1, PPL_CHUNK)]
    pieces = [p for p in pieces if len(p) > 1]
    return [p[:1] for p in pieces], [p[1:] for p in pieces]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def classify_labels(engine: Engine, count: int) -> list[str]:
    """The labels label scoring gives the shipped tickets (the classify task's prompts)."""
    from classify_bench import bulkrun_scoring, calibrate, chat_ids, load_tickets

    from bulkrun.tasks.base import Item, TaskContext
    from bulkrun.tasks.classify import ClassifyTask
    from bulkrun.tasks.labels import LabelSet

    rows = load_tickets(count)
    task = ClassifyTask(LabelSet(tuple(dict.fromkeys(r["label"] for r in rows))))
    task.bind(TaskContext(engine.tokenizer, engine.max_model_len, SamplingParams()))
    prompts = [chat_ids(engine.tokenizer, task.render(Item(i, r["id"], r))) for i, r in enumerate(rows)]
    calibrate(engine, task, engine.tokenizer)  # the task's default, as a job runs it
    labels, _raw = bulkrun_scoring(engine, task, prompts, True)[0]
    return labels


def load_variants() -> dict[str, Engine]:
    """fp32 (the reference), bf16 as it runs by default (fp32 residual stream), and bf16 with the
    residual stream in bf16 too, so the choice between them is by figures. The last gets a model of
    its own: a second load with the default's settings would return the default's model."""
    model_dir = str(resolve_model(None))
    variants = {name: load_engine(model_dir, EngineConfig(dtype=name)) for name in ("float32", "bfloat16")}
    loaded_model.forget()
    bf16_stream = load_engine(model_dir, EngineConfig(dtype="bfloat16"))
    assert bf16_stream.runner.model is not variants["bfloat16"].runner.model
    bf16_stream.runner.model.residual_dtype = None
    variants["bf16 (bf16 stream)"] = bf16_stream
    return variants


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--tickets", type=int, default=100, help="shipped tickets classified under each precision"
    )
    args = ap.parse_args()
    engines = load_variants()
    tokenizer = engines["float32"].tokenizer
    prompts = chat_prompts(tokenizer, args.prompts)
    results = {}
    for name, engine in engines.items():
        greedy(engine, prompts[:4], 4)  # warm-up
        runs = [greedy(engine, prompts, args.max_new) for _ in range(args.repeats)]
        secs = statistics.median(r[0] for r in runs)
        results[name] = {"seconds": secs, "outputs": runs[0][1], "runs": [round(r[0], 2) for r in runs]}
    ref = results["float32"]
    firsts, rests = text_chunks(tokenizer)
    for name, engine in engines.items():
        r = results[name]
        r["scored"] = score(engine, prompts, ref["outputs"])
        lps = [lp for piece in score(engine, firsts, rests) for lp in piece]
        r["ppl"] = math.exp(-sum(lps) / len(lps))
        r["labels"] = classify_labels(engine, args.tickets)
    print(
        f"workload: {len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens, {args.max_new} new, greedy"
    )
    print(f"{'precision':<20} {'gen tok':>8} {'median s':>9} {'tok/s':>8}  runs")
    for name, r in results.items():
        gen = sum(map(len, r["outputs"]))
        print(f"{name:<20} {gen:>8} {r['seconds']:>9.2f} {gen / r['seconds']:>8.1f}  {r['runs']}")
    mean_len = statistics.mean(map(len, ref["outputs"]))
    print(f"quality against fp32 ({len(ref['outputs'])} prompts, mean fp32 output {mean_len:.1f} tokens):")
    print(
        f"{'precision':<20} {'speed':>6} {'greedy same':>12} {'mean prefix':>12} {'|dlogp|':>8} {'max':>6} "
        f"{'ppl':>9} {'ppl diff':>9} {'labels same':>12}"
    )
    for name, r in results.items():
        if r is ref:
            print(
                f"{name:<20} {1:>5.2f}x {'':>12} {'':>12} {'':>8} {'':>6} {r['ppl']:>9.4f} {'':>9} {'':>12}"
            )
            continue
        same = sum(a == b for a, b in zip(r["outputs"], ref["outputs"], strict=True))
        prefix = statistics.mean(
            common_prefix(a, b) for a, b in zip(r["outputs"], ref["outputs"], strict=True)
        )
        diffs = [
            abs(x - y)
            for a, b in zip(r["scored"], ref["scored"], strict=True)
            for x, y in zip(a, b, strict=True)
        ]
        same_of = f"{same}/{len(ref['outputs'])}"
        labels = sum(a == b for a, b in zip(r["labels"], ref["labels"], strict=True)) / len(ref["labels"])
        print(
            f"{name:<20} {ref['seconds'] / r['seconds']:>5.2f}x {same_of:>12} "
            f"{prefix:>12.1f} {statistics.mean(diffs):>8.4f} {max(diffs):>6.3f} {r['ppl']:>9.4f} "
            f"{(r['ppl'] / ref['ppl'] - 1) * 100:>+8.2f}% {labels:>11.0%}"
        )


if __name__ == "__main__":
    main()
