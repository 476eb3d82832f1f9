"""`bulkrun plan`'s wall-time estimate against the real run, for two job sizes on the default model.

For each size: the shipped tickets (bulkrun/data/tickets.jsonl) repeated to N rows with fresh ids,
greedy generation of a few tokens; `bulkrun plan --json` (its own sample run on the engine), then the
job itself (`bulkrun generate`), each in a fresh process. Printed: plan's estimate, the job's engine wall
time (report.json wall_time_s: from the first row read to the last shard committed; model loading is
not part of either), their ratio, the engine tokens/s of plan's sample and of the run (where a miss
comes from), and whether plan's row and prompt-token counts equal the job's.
A size is flagged when the estimate misses the actual run by more than 25%. On a shared machine one run
of either varies by up to a third from the next, so each size runs --repeats plan-then-run pairs and
compares medians.

    flock /tmp/bulkrun-bench.lock .venv/bin/python bench/plan_bench.py [--sizes 40,160] [--max-tokens 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICKETS = ROOT / "bulkrun" / "data" / "tickets.jsonl"


def write_input(path: Path, rows: int) -> None:
    tickets = [json.loads(line) for line in TICKETS.read_text(encoding="utf-8").splitlines() if line.strip()]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"t{i}", "text": tickets[i % len(tickets)]["text"]}) + "\n")


def bulkrun(*args: str) -> str:
    cmd = [str(Path(sys.executable).parent / "bulkrun"), *args]  # the console script of this venv
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def measure(rows: int, max_tokens: int, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    source = work / f"tickets-{rows}.jsonl"
    write_input(source, rows)
    job = [str(source), "--id-field", "id", "--max-tokens", str(max_tokens), "--quiet"]
    plan = json.loads(bulkrun("plan", *job, "--json"))
    out = work / f"run-{rows}"
    bulkrun("generate", *job, "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    return {
        "rows": rows,
        "estimate_s": plan["wall_seconds_estimate"],
        "actual_s": report["wall_time_s"],
        "sample_tok_s": plan["engine_tokens_per_s"],
        "actual_tok_s": (
            report["prompt_tokens"] * (1 - report["prefix_cache_hit_rate"]) + report["generated_tokens"]
        )
        / max(report["wall_time_s"], 1e-9),
        "counts_equal": plan["rows"] == report["rows"] and plan["prompt_tokens"] == report["prompt_tokens"],
        "step_cost": plan["step_cost"],
        "generated_estimate": plan["generated_tokens_estimate"],
        "generated_actual": report["generated_tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="40,160", help="job sizes in rows, comma separated")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--repeats", type=int, default=3, help="plan-then-run pairs per size (medians compared)"
    )
    args = parser.parse_args()
    print(f"plan estimate vs actual run, default model, greedy, max_tokens {args.max_tokens}", flush=True)
    print(
        f"{'rows':>6} {'estimate s':>11} {'actual s':>9} {'est/act':>8} {'sample tok/s':>12} {'run tok/s':>9}  "
        "counts  step cost fitted on the sample (fixed ms + per prompt token ms + per decode row ms)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="plan-bench-") as tmp:
        for rows in (int(s) for s in args.sizes.split(",")):
            pairs = [measure(rows, args.max_tokens, Path(tmp) / str(k)) for k in range(args.repeats)]
            m = dict(pairs[0])
            for key in ("estimate_s", "actual_s", "sample_tok_s", "actual_tok_s"):
                m[key] = statistics.median(p[key] for p in pairs)
            m["counts_equal"] = all(p["counts_equal"] for p in pairs)
            ratio = m["estimate_s"] / m["actual_s"]
            print(
                "        pairs (estimate/actual s): "
                + ", ".join(f"{p['estimate_s']:.2f}/{p['actual_s']:.2f}" for p in pairs),
                flush=True,
            )
            flag = "ok" if abs(ratio - 1) <= 0.25 else "OFF BY >25%"
            print(
                f"{rows:>6} {m['estimate_s']:>11.1f} {m['actual_s']:>9.1f} {ratio:>8.2f} "
                f"{m['sample_tok_s']:>12.1f} {m['actual_tok_s']:>9.1f}  "
                f"{'equal' if m['counts_equal'] else 'DIFFER'}  {_step_cost(m['step_cost'])}  {flag}",
                flush=True,
            )


def _step_cost(cost: dict | None) -> str:
    if cost is None:
        return "none (tokens/s)"
    return (
        f"{cost['fixed'] * 1e3:.1f} + {cost['per_prefill_token'] * 1e3:.3f}/tok + "
        f"{cost['per_decode_row'] * 1e3:.3f}/row"
    )


if __name__ == "__main__":
    main()
