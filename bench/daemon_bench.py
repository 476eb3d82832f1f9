"""What `bulkrun daemon` saves a whole small job: `bulkrun generate` as a user runs it (the console
script, launch to exit), on its own, with a daemon keeping the default model resident, and with a
daemon keeping only the imports (`--no-model`); alternating rounds, medians. Also the job's own wall
time from its report.json (the part after start-up).

    .venv/bin/python bench/daemon_bench.py [--rows 24] [--max-tokens 32] [--rounds 8]
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

sys.path.insert(0, str(Path(__file__).parent))

from workload import chat_texts  # noqa: E402

BULKRUN = str(Path(sys.executable).with_name("bulkrun"))


def run(rows: Path, max_tokens: int, env: dict) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        cmd = [
            BULKRUN,
            "generate",
            str(rows),
            "--out",
            f"{tmp}/out",
            "--max-tokens",
            str(max_tokens),
            "--quiet",
        ]
        subprocess.run(cmd, check=True, env=env)
        total = time.perf_counter() - t0
        return total, json.loads(Path(tmp, "out", "report.json").read_text())["wall_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    from bulkrun.engine.tokenizer import load_tokenizer
    from bulkrun.model_source import resolve_model

    texts = chat_texts(load_tokenizer(resolve_model(None)), n=args.rows)
    with tempfile.TemporaryDirectory(prefix="bulkrun-daemon-bench-") as tmp:
        rows = Path(tmp, "rows.jsonl")
        rows.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
        base = {k: v for k, v in os.environ.items() if k != "BULKRUN_NO_DAEMON"}
        systems = {
            "on its own": {**base, "BULKRUN_NO_DAEMON": "1"},
            "daemon, model resident": {**base, "BULKRUN_DAEMON_DIR": f"{tmp}/a"},
            "daemon, imports only": {**base, "BULKRUN_DAEMON_DIR": f"{tmp}/b"},
        }
        subprocess.run([BULKRUN, "daemon", "start"], check=True, env=systems["daemon, model resident"])
        subprocess.run(
            [BULKRUN, "daemon", "start", "--no-model"], check=True, env=systems["daemon, imports only"]
        )
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in systems}
        try:
            for _ in range(args.rounds):
                for name, env in systems.items():
                    results[name].append(run(rows, args.max_tokens, env))
        finally:
            for name in ("daemon, model resident", "daemon, imports only"):
                subprocess.run([BULKRUN, "daemon", "stop"], env=systems[name])
    print(
        f"`bulkrun generate`, {args.rows} rows x {args.max_tokens} new tokens, medians of {args.rounds} rounds:"
    )
    alone = statistics.median(r[0] for r in results["on its own"])
    for name, runs in results.items():
        total, job = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        print(
            f"  {name:<24} launch to exit {total:6.2f} s  (the job itself {job:5.2f} s)  {alone / total:5.2f}x"
        )


if __name__ == "__main__":
    main()
