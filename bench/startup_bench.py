"""Start-up benchmark: from launching `bulkrun` to its first engine step, default model, warm cache.

1. The CLI as a user runs it (`bulkrun generate` of one row, one new token), each run a fresh
   process: seconds from launch to the end of the first engine step, and to the process's exit;
   first on its own (no daemon), then with `bulkrun daemon` up (the command runs in a child forked
   from the resident process, which has torch and the model loaded).
2. The same path taken apart, phase by phase, in one fresh process per run (the order the CLI
   loads things in), beside the floor no code of ours can go under: an empty interpreter and
   `import torch` alone.
Target: <= 1 s to the first engine step. Medians of --repeats runs.

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

# Makes a child process print when its first engine step ended (time.time()), to its stderr: in
# a daemon's child that is the client's.
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

# The daemon (its jobs' first steps marked).
DAEMON_SERVER = (
    MARK_FIRST_STEP
    + """
from bulkrun.cli import daemon_client as client, daemon_server
sys.argv = ["daemon_server", "--socket", str(client.socket_path(client.private_dir(create=True)))]
daemon_server.main()
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


def cli_run(tmp: Path, index: int, daemon: bool = False) -> tuple[float, float]:
    """One `bulkrun generate`: on its own (patched to say when its first step ended), or as a user
    runs it (the console script) while the daemon is up."""
    rows = tmp / "one.jsonl"
    rows.write_text(json.dumps({"id": "a", "text": "Hello"}) + "\n")
    out = tmp / f"out{index}"
    args = ["generate", str(rows), "--out", str(out), "--max-tokens", "1", "--quiet"]
    cmd = [str(Path(PYTHON).with_name("bulkrun")), *args] if daemon else [PYTHON, "-c", CLI_CHILD, *args]
    env = {**os.environ, **({} if daemon else {"BULKRUN_NO_DAEMON": "1"})}
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    total = time.time() - t0
    first = next(float(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("FIRST_STEP"))
    return first - t0, total


def with_daemon(repeats: int) -> tuple[float, list[tuple[float, float]]]:
    """Start a daemon (in a folder of its own), time `repeats` commands through it, stop it."""
    with tempfile.TemporaryDirectory(prefix="bulkrun-startup-") as tmp:
        os.environ["BULKRUN_DAEMON_DIR"] = f"{tmp}/d"
        os.environ.pop("BULKRUN_NO_DAEMON", None)
        from bulkrun.cli import daemon_client as client

        t0 = time.perf_counter()
        server = subprocess.Popen([PYTHON, "-c", DAEMON_SERVER], stderr=subprocess.DEVNULL)
        while client.ask(client.socket_path(client.private_dir(create=True)), "status") is None:
            time.sleep(0.02)
        started = time.perf_counter() - t0
        try:
            runs = [cli_run(Path(tmp), i, daemon=True) for i in range(repeats)]
        finally:
            server.terminate()
            server.wait()
    return started, runs


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
    daemon_start, daemon_runs = with_daemon(args.repeats)
    empty = statistics.median(timed_child("pass") for _ in range(args.repeats))
    torch_only = statistics.median(timed_child("import torch") for _ in range(args.repeats))
    first = statistics.median(c[0] for c in cli)
    print(f"`bulkrun generate` (1 row, 1 token), median of {args.repeats} fresh processes:")
    print(
        f"  launch -> first engine step  {first:6.2f} s   (target <= 1 s)  runs {[round(c[0], 2) for c in cli]}"
    )
    print(f"  launch -> exit               {statistics.median(c[1] for c in cli):6.2f} s")
    print(
        f"with `bulkrun daemon` up (it started in {daemon_start:.2f} s, once), the console script, median of {args.repeats}:"
    )
    runs = [round(c[0], 2) for c in daemon_runs]
    print(
        f"  launch -> first engine step  {statistics.median(c[0] for c in daemon_runs):6.2f} s   (target <= 1 s)  runs {runs}"
    )
    print(f"  launch -> exit               {statistics.median(c[1] for c in daemon_runs):6.2f} s")
    print("on its own, by phase (medians):")
    for name in phases[0]:
        print(f"  {name:<50} {statistics.median(p[name] for p in phases) * 1000:7.0f} ms")
    print(
        f"floor: an empty interpreter {empty * 1000:.0f} ms, `import torch` alone {torch_only * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
