"""bench/gpu_check.sh fits its device time: the dry run sums the stage limits under the deadline."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.sh"


def _dry_run(**env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)], env={**os.environ, "GPU_CHECK_DRY_RUN": "1", **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _total(out: str) -> int:
    return int(re.search(r"total: at most (\d+)s", out).group(1))


def test_every_stage_fits_within_seven_minutes():
    run = _dry_run()
    assert run.returncode == 0, run.stderr
    assert _total(run.stdout) <= 420
    limits = dict(re.findall(r"stage (\d\d) \S+ +limit +(\d+)s", run.stdout))
    assert sorted(limits) == ["01", "02", "03", "04", "05", "06", "07"]
    assert all(int(v) >= 20 for v in limits.values())  # no stage squeezed out by the others


def test_the_optional_8b_stage_only_takes_what_is_left():
    run = _dry_run(GPU_CHECK_8B="1")
    assert run.returncode == 0 and "stage 08 bench-8b" in run.stdout
    assert _total(run.stdout) <= 420


def test_a_shorter_deadline_shortens_the_later_stages():
    run = _dry_run(GPU_CHECK_DEADLINE="120")
    assert _total(run.stdout) <= 120
    assert re.search(r"stage 07 bench-1b +limit +0s", run.stdout)  # skipped as out of time
