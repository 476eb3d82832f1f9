"""One Ray worker: loads one engine once, then runs whole slices of the job with the job layer's runner.

The worker writes its own shards straight into the job's output directory; committed shards are the
only truth, so a worker that dies loses nothing but its uncommitted items, which its slice's next
attempt (a replacement, or another worker) redoes.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import socket
from typing import Any

from bulkrun.distributed.partition import Partition
from bulkrun.distributed.progress import ProgressReporter

DEFAULT_RUNNER = "bulkrun.distributed.joblayer"  # module with build_engine / run_slice / driver_session


class SliceWorker:
    """Wrapped with ray.remote by the runner (one GPU or some CPUs each)."""

    def __init__(self, spec: Any, board: Any, runner: str = DEFAULT_RUNNER) -> None:
        self._spec = _quiet(spec)
        self._board = board
        self._engine: Any = None
        self._failed: Exception | None = None
        try:
            self._runner = importlib.import_module(runner)
            self._engine = self._runner.build_engine(spec)
        except Exception as exc:  # kept for ready(): Ray would hide a constructor error's type
            self._failed = exc

    def ready(self) -> dict:
        """Where this worker runs, once the engine is loaded; raises what loading it raised."""
        if self._failed is not None:
            raise self._failed
        return {"pid": os.getpid(), "host": socket.gethostname(), "device": _device(self._engine)}

    def run_slice(self, partition: Partition, attempt: str) -> dict:
        reporter = ProgressReporter(self._board, attempt)
        try:
            return self._runner.run_slice(self._spec, partition, self._engine, on_progress=reporter)
        finally:
            reporter.flush()


def _quiet(spec: Any) -> Any:
    """The driver shows the one bar; a worker's own bar would only clutter the driver's terminal."""
    if dataclasses.is_dataclass(spec) and any(f.name == "quiet" for f in dataclasses.fields(spec)):
        return dataclasses.replace(spec, quiet=True)
    return spec


def _device(engine: Any) -> str:
    """The engine's device ("cuda:0" on a GPU worker, "cpu"), for the driver's view of its workers."""
    device = getattr(getattr(engine, "runner", None), "device", None)
    return str(device) if device is not None else "unknown"
