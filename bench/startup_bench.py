"""Start-up benchmark: from launching `bulkrun` to its first engine step, default model, warm cache.

1. The CLI as a user runs it (`bulkrun generate` of one row, one new token), each run a fresh
   process: seconds from launch to the end of the first engine step, and to the process's exit.
2. The same path taken apart, phase by phase, in one fresh process per run (the order the CLI
   loads things in), beside the floor no code of ours can go under: an empty interpreter and
   `import torch` alone.
Medians of --repeats runs.

    .venv/bin/python bench/startup_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = sys.executable

# Makes a child process print when its first engine step ended (time.time()), to its stderr.
MARK_FIRST_STEP = """
import sys, time
from bulkrun.engine.core import engine
step = engine.Engine.step
def first_step(self, _done=[]):
    out = step(self)
    if not _done:
        _done.append(1)
        print("FIRST_STEP", time.time(), file=sys.stderr, flush=True)
    return out
engine.Engine.step = first_step
"""

# The CLI in a child process.
CLI_CHILD = (
    MARK_FIRST_STEP
    + """
from bulkrun.cli import main
sys.argv = ["bulkrun", *sys.argv[1:]]
main()
"""
)

# The CLI's loading path, one phase at a time (its durations printed as JSON).
PHASES_CHILD = """
import json, sys, time
marks, last = {}, time.perf_counter()
def mark(name):
    global last
    now = time.perf_counter(); marks[name] = now - last; last = now
import bulkrun.cli; mark("import bulkrun.cli (typer, job layer)")
import torch; mark("import torch")
from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.worker import loaded_model as r
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.load import load_engine
from bulkrun.engine.core.params import EngineRequest, SamplingParams
mark("import the engine (runner, model, kernels)")
from bulkrun.model_source import resolve_model
model_dir = str(resolve_model(None)); mark("resolve the model")
tok = r.load_tokenizer(model_dir); mark("load the tokenizer (its renderer imports in a thread)")
config = EngineConfig()
device = r.resolve_device(config.device)
r.keep_freed_memory()
ops = r.get_ops(config.kernels, device); mark("kernels: build check, load the .so")
_, dtype, _ = r.resolve_device_dtype(config, ops.backend)
model = r.load_model(model_dir, ops, dtype, device); mark("load the model (mapped weight cache)")
r.build_greedy_head(model, device, dtype, ops.backend); mark("greedy head (norms, bf16 pack)")
r.pack_linears_for_cpu(model); mark("pack the linears for oneDNN")
prompt = tok.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
mark("first chat template (waits for its renderer)")
del model
t = time.perf_counter()
engine = load_engine(model_dir, config)
marks["(the whole engine load again, as the CLI does it)"] = time.perf_counter() - t
last = time.perf_counter()
engine.generate([EngineRequest("a", prompt, SamplingParams(max_tokens=1))]); mark("first engine step")
print(json.dumps(marks))
"""


def cli_run(tmp: Path, index: int) -> tuple[float, float]:
    """One `bulkrun generate` (patched to say when its first step ended)."""
    rows = tmp / "one.jsonl"
    rows.write_text(json.dumps({"id": "a", "text": "Hello"}) + "\n")
    out = tmp / f"out{index}"
    args = ["generate", str(rows), "--out", str(out), "--max-tokens", "1", "--quiet"]
    t0 = time.time()
    proc = subprocess.run([PYTHON, "-c", CLI_CHILD, *args], capture_output=True, text=True, check=True)
    total = time.time() - t0
    first = next(float(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("FIRST_STEP"))
    return first - t0, total


def timed_child(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([PYTHON, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    subprocess.run([PYTHON, "-c", PHASES_CHILD], check=True, capture_output=True)  # warm the caches
    with tempfile.TemporaryDirectory() as tmp:
        cli = [cli_run(Path(tmp), i) for i in range(args.repeats)]
    phases = [
        json.loads(
            subprocess.run([PYTHON, "-c", PHASES_CHILD], check=True, capture_output=True, text=True).stdout
        )
        for _ in range(args.repeats)
    ]
    empty = statistics.median(timed_child("pass") for _ in range(args.repeats))
    torch_only = statistics.median(timed_child("import torch") for _ in range(args.repeats))
    first = statistics.median(c[0] for c in cli)
    print(f"`bulkrun generate` (1 row, 1 token), median of {args.repeats} fresh processes:")
    print(f"  launch -> first engine step  {first:6.2f} s   runs {[round(c[0], 2) for c in cli]}")
    print(f"  launch -> exit               {statistics.median(c[1] for c in cli):6.2f} s")
    print("by phase (medians):")
    for name in phases[0]:
        print(f"  {name:<50} {statistics.median(p[name] for p in phases) * 1000:7.0f} ms")
    print(
        f"floor: an empty interpreter {empty * 1000:.0f} ms, `import torch` alone {torch_only * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
