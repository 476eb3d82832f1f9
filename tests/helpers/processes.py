"""bulkrun child processes for signal tests: one that pauses at a chosen point (signalled once it
got there), and one killed with SIGKILL once its job reached a stage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def start_until_marker(script: str, marker: Path, args: list[str], stderr, timeout_s: float = 120):
    """Run `python -c script MARKER ARGS...` and wait until it creates MARKER (its pause point).
    `stderr`: an open file (not a pipe nobody reads while it runs). Returns the running Popen."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(marker), *args], stdout=subprocess.DEVNULL, stderr=stderr
    )
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline and not marker.exists():
        time.sleep(0.01)
    assert marker.exists(), f"the run never reached its pause point (exit {proc.poll()})"
    return proc


def reached_stage(out: Path, stage: int) -> bool:
    """Stage 0: the run holds the lock (work begins); stage k > 0: k result shards committed."""
    if stage == 0:
        return (out / "lock").exists()
    return len(list((out / "shards").glob("*.parquet"))) >= stage


def start_and_kill(args: list[str], out: Path, stage: int, delay: float) -> None:
    """Start a run, wait for `stage` plus `delay` seconds, then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bulkrun.cli import main; main()", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not reached_stage(out, stage):
        time.sleep(0.01)
    time.sleep(delay)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
