"""CPU precision benchmark: bulkrun's engine in bfloat16 against itself in float32, on the engine
bench's workload (48 chat prompts, 64 new tokens, greedy), in one process.

Speed: engine wall time of each precision, median of --repeats runs on a cold prefix cache.
Quality, against the fp32 run as reference:
  - greedy outputs identical to fp32's (count) and the mean common prefix (tokens);
  - mean |log p| difference of fp32's chosen tokens, scored teacher-forced under both precisions;
  - perplexity of a held-in text sample (the shipped tickets) under both (target: within 1%).

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

from bulkrun.engine.config import EngineConfig  # noqa: E402
from bulkrun.engine.engine import Engine  # noqa: E402
from bulkrun.engine.params import EngineRequest, SamplingParams  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model_dir = str(resolve_model(None))
    engines = {
        name: Engine.from_model(model_dir, EngineConfig(dtype=name)) for name in ("float32", "bfloat16")
    }
    tokenizer = engines["float32"].runner.tokenizer
    prompts = chat_prompts(tokenizer, args.prompts)
    results = {}
    for name, engine in engines.items():
        greedy(engine, prompts[:4], 4)  # warm-up
        runs = [greedy(engine, prompts, args.max_new) for _ in range(args.repeats)]
        secs = statistics.median(r[0] for r in runs)
        results[name] = {"seconds": secs, "outputs": runs[0][1], "runs": [round(r[0], 2) for r in runs]}
    ref = results["float32"]["outputs"]
    firsts, rests = text_chunks(tokenizer)
    for name, engine in engines.items():
        r = results[name]
        r["scored"] = score(engine, prompts, ref)
        lps = [lp for piece in score(engine, firsts, rests) for lp in piece]
        r["ppl"] = math.exp(-sum(lps) / len(lps))
    print(
        f"workload: {len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens, {args.max_new} new, greedy"
    )
    print(f"{'precision':<10} {'gen tok':>8} {'median s':>9} {'tok/s':>8}  runs")
    for name, r in results.items():
        gen = sum(map(len, r["outputs"]))
        print(f"{name:<10} {gen:>8} {r['seconds']:>9.2f} {gen / r['seconds']:>8.1f}  {r['runs']}")
    speedup = results["float32"]["seconds"] / results["bfloat16"]["seconds"]
    print(f"bf16 engine speed vs fp32: {speedup:.2f}x")
    bf = results["bfloat16"]
    same = sum(a == b for a, b in zip(bf["outputs"], ref, strict=True))
    prefix = statistics.mean(common_prefix(a, b) for a, b in zip(bf["outputs"], ref, strict=True))
    diffs = [
        abs(x - y)
        for a, b in zip(bf["scored"], results["float32"]["scored"], strict=True)
        for x, y in zip(a, b, strict=True)
    ]
    print(
        f"greedy identical to fp32: {same}/{len(ref)}; mean common prefix {prefix:.1f} of {statistics.mean(map(len, ref)):.1f} tokens"
    )
    print(
        f"mean |logprob diff| of fp32's chosen tokens: {statistics.mean(diffs):.4f} (max {max(diffs):.3f}, {len(diffs)} tokens)"
    )
    ppl32, ppl16 = results["float32"]["ppl"], bf["ppl"]
    print(
        f"perplexity of the tickets text: fp32 {ppl32:.4f}, bf16 {ppl16:.4f} ({(ppl16 / ppl32 - 1) * 100:+.2f}%)"
    )


if __name__ == "__main__":
    main()
