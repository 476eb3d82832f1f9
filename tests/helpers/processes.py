"""A bulkrun child process that pauses at a chosen point: tests signal it once it got there."""

from __future__ import annotations

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
