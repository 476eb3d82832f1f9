"""One Ray worker: loads one engine once, then runs whole slices of the job with the job layer.

The worker writes its own shards straight into the job's output directory; committed shards are the
only truth, so a worker that dies loses nothing but its uncommitted items, which its slice's next
attempt (a replacement, or another worker) redoes.

The driver and the workers reach the job layer only through this module's three functions
(`build_engine`, `run_slice`, `driver_session`), so tests can swap in another module with the same
three names (`run_on_ray(spec, runner="module")`). An output URI (s3://...) is handled here too:
the job layer then works on a local mirror (uri.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bulkrun.io.mirror import uri_out
from bulkrun.job.slices import Partition
from bulkrun.job.stats import RunStats

DEFAULT_RUNNER = "bulkrun.distributed.ray_worker"  # module with build_engine / run_slice / driver_session


# ---- the job layer's door ---------------------------------------------------------------------


def build_engine(spec: Any) -> Any:
    """Load the job's engine once per worker."""
    from bulkrun.job.session import load_engine

    return load_engine(spec)


def run_slice(
    spec: Any, partition: Partition, engine: Any, on_progress: Callable[[int, int], None]
) -> RunStats:
    """Run one slice to the end (resuming from committed shards) and return its figures."""
    from bulkrun.job import runner

    def run(local_spec: Any) -> RunStats:
        return runner.run_slice(local_spec, partition, engine, on_progress)

    if uri_out(spec):
        from bulkrun.distributed.uri import run_slice_at_uri

        return run_slice_at_uri(spec, partition, run)
    return run(spec)


@contextmanager
def driver_session(spec: Any) -> Iterator[Any]:
    """Lock OUT, check or write the manifest; yields a session with `total_rows` and
    `finalize(stats, extra)`."""
    if uri_out(spec):
        from bulkrun.distributed.uri import driver_session_at_uri as session_for
    else:
        from bulkrun.job.session import open_job as session_for

    with session_for(spec) as session:
        yield session


# ---- the worker actor -------------------------------------------------------------------------


class SliceWorker:
    """Wrapped with ray.remote by the driver (one GPU or some CPUs each)."""

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

    def run_slice(self, partition: Partition, attempt: str) -> RunStats:
        reporter = ProgressReporter(self._board, attempt)
        try:
            return self._runner.run_slice(self._spec, partition, self._engine, on_progress=reporter)
        finally:
            reporter.flush()


class ProgressReporter:
    """A worker's progress hook for run_slice: batches its counts into few calls to the driver's
    ProgressBoard actor."""

    def __init__(self, board: Any, attempt: str, every_s: float = 0.25) -> None:
        self._board = board
        self._attempt = attempt
        self._every_s = every_s
        self._items = 0
        self._tokens = 0
        self._last = 0.0

    def __call__(self, items: int, tokens: int = 0) -> None:
        self._items += items
        self._tokens += tokens
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self.flush()
            self._last = now

    def flush(self) -> None:
        if self._items or self._tokens:
            # Fire and forget: calls from one caller reach the actor in order.
            self._board.add.remote(self._attempt, self._items, self._tokens)
            self._items = self._tokens = 0


def _quiet(spec: Any) -> Any:
    """The driver shows the one bar; a worker's own bar would only clutter the driver's terminal."""
    if dataclasses.is_dataclass(spec) and any(f.name == "quiet" for f in dataclasses.fields(spec)):
        return dataclasses.replace(spec, quiet=True)
    return spec


def _device(engine: Any) -> str:
    """The engine's device ("cuda:0" on a GPU worker, "cpu"), for the driver's view of its workers."""
    device = getattr(getattr(engine, "runner", None), "device", None)
    return str(device) if device is not None else "unknown"
