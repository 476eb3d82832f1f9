"""bench/gpu_check.sh fits its device time: the dry run sums the stage limits under the deadline; and
the family and batch-invariance stages run end to end on the CPU (tiny shapes, interpreted
kernels), so a mistake in them costs no GPU minutes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.sh"
DEADLINE = 470  # under the 8 minutes a lent GPU gives the script


def _dry_run(**env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)], env={**os.environ, "GPU_CHECK_DRY_RUN": "1", **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _total(out: str) -> int:
    return int(re.search(r"total: at most (\d+)s", out).group(1))


def test_every_stage_fits_within_eight_minutes():
    run = _dry_run()
    assert run.returncode == 0, run.stderr
    assert _total(run.stdout) <= DEADLINE < 480
    limits = dict(re.findall(r"stage (\d\d) \S+ +limit +(\d+)s", run.stdout))
    assert sorted(limits) == [f"{n:02d}" for n in range(1, 11)]
    assert all(int(v) >= 15 for v in limits.values())  # no stage squeezed out by the others


def test_the_optional_8b_stage_only_takes_what_is_left():
    run = _dry_run(GPU_CHECK_8B="1")
    assert run.returncode == 0 and "stage 11 bench-8b" in run.stdout
    assert _total(run.stdout) <= DEADLINE


def test_a_shorter_deadline_shortens_the_later_stages():
    run = _dry_run(GPU_CHECK_DEADLINE="120")
    assert _total(run.stdout) <= 120
    assert re.search(r"stage 07 bench-1b +limit +0s", run.stdout)  # skipped as out of time
    assert re.search(r"stage 10 invariance +limit +0s", run.stdout)


def test_family_and_invariance_stages_run_on_the_cpu(tmp_path):
    env = {
        **os.environ,
        "GPU_CHECK_CPU": "1",
        "STAGES": "08 09 10",
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
    }
    env.pop("GPU_CHECK_DRY_RUN", None)
    run = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    summary = (tmp_path / "summary.txt").read_text()
    assert run.returncode == 0, summary + (tmp_path / "log.txt").read_text()[-3000:]
    results = {r["name"]: r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    assert sorted(results) == ["gemma3", "invariance", "qwen3-moe"]
    assert all(r["pass"] for r in results.values())
    phases = {name: set(r["figures"]) - {"ok"} for name, r in results.items()}
    assert phases == {"gemma3": {"fp32_greedy", "throughput"},
                      "qwen3-moe": {"moe_kernels", "fp32_greedy", "throughput"},
                      "invariance": {"invariance", "cost"}}  # fmt: skip
    greedy = results["gemma3"]["figures"]["fp32_greedy"]
    assert greedy["tokens"] > 0 and min(greedy["prompt_lengths"]) > greedy["window"]
    assert results["invariance"]["figures"]["invariance"]["moved_from_alone"] == {
        "all together": 0, "reversed, 8-token budget, 4 sequences": 0}  # fmt: skip
    progress = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [(p["stage"], p["phase"]) for p in progress] == [
        ("08", "fp32_greedy"), ("08", "throughput"), ("09", "moe_kernels"), ("09", "fp32_greedy"),
        ("09", "throughput"), ("10", "invariance"), ("10", "cost"),
    ]  # fmt: skip


def test_a_phase_that_does_not_fit_is_skipped_and_recorded(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from gpu_stage import Stage

    monkeypatch.setenv("GPU_CHECK_PROGRESS", str(tmp_path / "progress.jsonl"))
    monkeypatch.setenv("GPU_CHECK_STAGE_NUM", "10")
    monkeypatch.setenv("GPU_CHECK_STAGE_DEADLINE", str(time.time() + 30))
    stage = Stage(tmp_path / "stage.json")
    stage.done("check", {"moved": 1}, False, "1 moved")
    assert stage.fits("short", 5) and not stage.fits("long", 60)
    figures = json.loads((tmp_path / "stage.json").read_text())
    assert figures["long"]["ok"] and "60s" in figures["long"]["skipped"] and figures["ok"] is False
    progress = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [(p["stage"], p["phase"]) for p in progress] == [("10", "check"), ("10", "long")]
    assert stage.exit_code() == 1
