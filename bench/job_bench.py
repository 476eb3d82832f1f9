"""Job-layer benchmark: memory that does not grow with the input, the job layer's own speed, and
length sorting on vs off on the real engine.

1. Peak RSS of a whole job on 2,000 vs 200,000 input rows, each in a fresh process, with an
   *instant fake engine* (it answers every request at once with one token), so what is measured is
   the job layer: reading, ids, rendering + chat template + batch tokenizing (default model's
   tokenizer), sorting, shards, the final merge: the growth between the two.
2. The same on the *real engine* (a tiny random model, so 200,000 rows finish in minutes; its KV
   cache is small per token, so the default 4 GiB budget holds millions of token slots and a pool
   that walked through untouched blocks would show it): peak RSS beside the KV cache's peak use
   from report.json.
3. The job layer's own items/s from the 200,000-row run (same instant engine), next to the items/s
   the real engine reaches in part 3: the job layer must be far faster, so it never starves it.
4. Length sorting on vs off: the same mixed-length workload (50-400 token prompts in one window,
   greedy, 16 new tokens, at most 8 running) through the real engine: tokens/s (median of
   --repeats alternating runs), engine steps and mean running batch.

    .venv/bin/python bench/job_bench.py [--small 2000] [--large 200000] [--engine-large 200000]
                                        [--sort-rows 24] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SORT_MAX_SEQS = 8  # fewer running slots than prompts, so the order of admission matters
WORDS = (
    "order invoice refund shipping account password login error crash update feature request billing "
    "payment card charge delivery package tracking warehouse customer support ticket reply agent answer"
).split()


def write_input(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
            f.write(json.dumps({"id": f"t{i}", "text": text}) + "\n")


class InstantEngine:
    """The Engine API answering every request in the step after it was added, with one token."""

    def __init__(self, tokenizer, max_model_len: int = 8192):
        from bulkrun.engine.core.outputs import StepStats

        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        self.waiting: list = []
        self.last_stats = StepStats(kv_blocks_total=1)

    def add_request(self, req) -> None:
        self.waiting.append(req)

    def has_capacity(self) -> bool:
        return len(self.waiting) < 256

    def has_unfinished(self) -> bool:
        return bool(self.waiting)

    def step(self):
        from bulkrun.engine.core.outputs import RequestOutput

        done, self.waiting = self.waiting, []
        return [RequestOutput(r.request_id, r.prompt_token_ids, [1], "x", "length") for r in done]

    def stream(self, requests, on_step=None):
        from bulkrun.engine.core.engine import Engine

        return Engine.stream(self, requests, on_step)  # the engine's one loop over this instant engine


def child_memory(input_path: str, out: str, model: str) -> dict:
    """Run one whole job on the instant engine; report peak RSS and the job layer's speed."""
    from transformers import AutoTokenizer

    from bulkrun.job.runner import run_job
    from bulkrun.job.spec import build_spec

    tokenizer = AutoTokenizer.from_pretrained(model)
    spec = build_spec([("bench", {"task": "generate", "input": input_path, "out": out, "model": model,
                                  "id_field": "id", "quiet": True, "max_tokens": 1})])  # fmt: skip
    started = time.perf_counter()
    report = run_job(spec, engine=InstantEngine(tokenizer))
    wall = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rows": report["results_total"], "wall_s": wall, "items_per_s": report["results_total"] / wall,
            "peak_rss_mib": peak_kib / 1024}  # fmt: skip


def child_engine_memory(input_path: str, out: str, model: str) -> dict:
    """Run one whole job on the real engine; peak RSS and the KV cache's figures from report.json."""
    from bulkrun.job.runner import run_job
    from bulkrun.job.spec import build_spec

    spec = build_spec([("bench", {"task": "generate", "input": input_path, "out": out, "model": model,
                                  "id_field": "id", "quiet": True, "max_tokens": 4})])  # fmt: skip
    started = time.perf_counter()
    report = run_job(spec)
    wall = time.perf_counter() - started
    keys = (
        "peak_rss_mb",
        "kv_cache_mb",
        "kv_cache_peak_mb",
        "kv_cache_touched_mb",
        "kv_cache_use_peak",
        "dtype",
        "prefix_cache_hit_rate",
    )
    return {"rows": report["results_total"], "wall_s": wall, **{k: report[k] for k in keys}}


def child_sorting(model: str, rows: int, repeats: int) -> dict:
    """The real engine on one mixed-length window, sorted by length or not, runs alternating (so
    the machine's drift hits both alike); tokens/s, engine steps and mean running batch."""
    from bulkrun.job.runner import run_job
    from bulkrun.job.session import load_engine
    from bulkrun.job.spec import build_spec

    workdir = Path(tempfile.mkdtemp(prefix="job-bench-sort-"))
    path = workdir / "mixed.jsonl"
    rng = random.Random(3)
    lines = [
        json.dumps(
            {"id": f"m{i}", "text": " ".join(rng.choice(WORDS) for _ in range(40 + 360 * i // (rows - 1)))}
        )
        for i in range(rows)
    ]  # ~50-400 tokens each
    rng.shuffle(lines)  # arrival order is not sorted
    path.write_text("\n".join(lines) + "\n")
    values = {"task": "generate", "input": str(path), "model": model, "quiet": True, "max_tokens": 16,
              "window": rows, "max_num_seqs": SORT_MAX_SEQS, "kv_cache_bytes": "1GiB", "enable_prefix_caching": False}  # fmt: skip
    engine = load_engine(build_spec([("bench", values | {"out": str(workdir / "warm")})]))
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for r in range(repeats):
        for mode in ("on", "off"):
            spec = build_spec(
                [("bench", values | {"out": str(workdir / f"{mode}{r}"), "sort_by_length": mode == "on"})]
            )
            runs[mode].append(run_job(spec, engine=engine))
    return {
        mode: {
            "tokens_per_s": statistics.median(r["total_tokens_per_s"] for r in reports),
            "items_per_s": statistics.median(r["items_per_s"] for r in reports),
            "steps": statistics.median(r["engine_steps"] for r in reports),
            "mean_batch": statistics.median(r["mean_running_batch"] for r in reports),
            "runs": [round(r["total_tokens_per_s"], 1) for r in reports],
        }
        for mode, reports in runs.items()
    }


def _child(args: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"child {args[0]} failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _model(tiny: bool) -> str:
    if not tiny:
        from bulkrun.model_source import resolve_model

        return str(resolve_model(None))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers.models import make_tiny_model

    return str(make_tiny_model(Path(tempfile.mkdtemp(prefix="job-bench-tiny-"))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=2_000)
    parser.add_argument("--large", type=int, default=200_000)
    parser.add_argument(
        "--engine-large", type=int, default=200_000, help="rows of the real engine's large run"
    )
    parser.add_argument("--skip-sorting", action="store_true", help="only the memory parts")
    parser.add_argument("--sort-rows", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="use a tiny random model instead of the default")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "memory":
            result = child_memory(*rest)
        elif kind == "engine-memory":
            result = child_engine_memory(*rest)
        else:
            result = child_sorting(rest[0], int(rest[1]), int(rest[2]))
        print(json.dumps(result))
        return
    model = _model(args.tiny)
    workdir = Path(tempfile.mkdtemp(prefix="job-bench-"))
    memory = {}
    for rows in (args.small, args.large):
        write_input(workdir / f"in-{rows}.jsonl", rows)
        memory[rows] = _child(
            ["memory", str(workdir / f"in-{rows}.jsonl"), str(workdir / f"out-{rows}"), model]
        )
    tiny = model if args.tiny else _model(True)
    engine_memory = {}
    for rows in (args.small, args.engine_large):
        write_input(workdir / f"in-{rows}.jsonl", rows)
        engine_memory[rows] = _child(
            ["engine-memory", str(workdir / f"in-{rows}.jsonl"), str(workdir / f"engine-out-{rows}"), tiny]
        )
    _print_memory(args, memory, engine_memory)
    if not args.skip_sorting:
        _print_sorting(args, memory, _child(["sorting", model, str(args.sort_rows), str(args.repeats)]))


def _print_memory(args, memory: dict, engine_memory: dict) -> None:
    small, large = memory[args.small], memory[args.large]
    growth = large["peak_rss_mib"] / small["peak_rss_mib"] - 1
    model = "a tiny random model's" if args.tiny else "the default model's"
    print(f"job layer (instant fake engine, {model} tokenizer, chat template on)")
    print(f"  {'rows':>9} {'peak RSS MiB':>13} {'items/s':>10} {'wall s':>8}")
    for rows, m in memory.items():
        print(f"  {rows:>9} {m['peak_rss_mib']:>13.1f} {m['items_per_s']:>10.0f} {m['wall_s']:>8.1f}")
    print(f"  peak RSS growth {args.small} -> {args.large} rows: {growth:+.1%}")
    print("real engine (tiny random model, 4 new tokens, default KV budget), from report.json")
    print(
        f"  {'rows':>9} {'peak RSS MiB':>13} {'KV budget MiB':>14} {'KV peak MiB':>12} {'KV touched MiB':>15} "
        f"{'prefix hits':>12} {'wall s':>8}"
    )
    for rows, m in engine_memory.items():
        print(f"  {rows:>9} {m['peak_rss_mb']:>13.1f} {m['kv_cache_mb']:>14.0f} {m['kv_cache_peak_mb']:>12.1f} "
              f"{m['kv_cache_touched_mb']:>15.1f} {m['prefix_cache_hit_rate']:>12.0%} {m['wall_s']:>8.1f}")  # fmt: skip
    first, last = engine_memory[args.small], engine_memory[args.engine_large]
    print(f"  peak RSS growth {args.small} -> {args.engine_large} rows: "
          f"{last['peak_rss_mb'] / first['peak_rss_mb'] - 1:+.1%}")  # fmt: skip


def _print_sorting(args, memory: dict, sorting: dict) -> None:
    large = memory[args.large]
    engine_items = sorting["on"]["items_per_s"]
    gain = sorting["on"]["tokens_per_s"] / sorting["off"]["tokens_per_s"] - 1
    print(f"job layer alone {large['items_per_s']:.0f} items/s vs real engine {engine_items:.2f} items/s "
          f"(x{large['items_per_s'] / max(engine_items, 1e-9):.0f} headroom)")  # fmt: skip
    print(f"length sorting, real engine, {args.sort_rows} prompts of 50-400 tokens in one window, 16 new "
          f"tokens, max {SORT_MAX_SEQS} running, greedy, on/off runs alternating")  # fmt: skip
    for s in ("on", "off"):
        r = sorting[s]
        print(f"  sort {s:>3}: {r['tokens_per_s']:8.1f} tok/s  {r['items_per_s']:6.2f} items/s  "
              f"{r['steps']:.0f} steps  mean batch {r['mean_batch']:.2f}  runs {r['runs']}")  # fmt: skip
    print(f"  sorting gain: {gain:+.1%} tokens/s (median of {args.repeats})")


if __name__ == "__main__":
    main()
