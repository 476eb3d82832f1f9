"""The Ray driver: one engine per worker, slices handed out from a queue, one bar, one merged result.

The job is split into as many slices as there are workers (row index modulo N). Each idle worker takes
the next slice; a worker that dies puts its slice back at the front of the queue and a replacement is
started, so the slice is finished by the replacement or by whichever worker is free first. A slice run
resumes from the committed shards, so nothing is lost or done twice. The driver holds the output
directory's lock, merges the shards in input order and writes one report, exactly as a local run.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bulkrun.distributed.cluster import Cluster, connect, import_ray
from bulkrun.distributed.options import ray_address
from bulkrun.distributed.ray_worker import DEFAULT_RUNNER, SliceWorker
from bulkrun.errors import BulkrunError
from bulkrun.io.outdir import is_uri
from bulkrun.job.slices import Partition, all_partitions
from bulkrun.job.stats import RunStats

POLL_S = 0.25


class WorkersKeepDying(BulkrunError):
    """More workers died than the restart budget allows (machines failing, out of memory, ...)."""


class WorkerStartFailed(BulkrunError):
    """A worker could not even be created (e.g. bulkrun is not importable on a node)."""


@dataclass
class WorkerSlot:
    """One worker actor as the driver sees it."""

    handle: Any
    number: int
    info: dict = field(default_factory=dict)  # pid, host, device (once ready)
    partition: Partition | None = None  # the slice it is running, if any
    attempt: str = ""


@dataclass
class DriverState:
    """What `on_tick` callbacks see (tests use it to kill a worker mid-job)."""

    workers: list[WorkerSlot]
    items_done: int = 0
    tokens: int = 0
    deaths: int = 0
    slices_done: int = 0


def run_on_ray(
    spec: Any, *, runner: str = DEFAULT_RUNNER, on_tick: Callable[[DriverState], None] | None = None
) -> dict:
    """Run the whole job on Ray and return the job's report (the same shape as a local run's).

    `runner` names the module with build_engine / run_slice / driver_session (ray_worker.py's door).
    `on_tick` is called with the DriverState about four times a second.
    """
    import_ray()  # before any work: without Ray, say how to install it
    spec = _absolute_paths(spec)  # workers may run in another directory, or on another machine
    workers_wanted = getattr(spec, "workers", None)
    with importlib.import_module(runner).driver_session(spec) as session:  # a changed job stops here
        cluster = connect(ray_address(getattr(spec, "ray", None)), workers_wanted)
        try:
            started = time.time()
            n_workers = _worker_count(cluster, workers_wanted)
            driver = _Driver(spec, cluster, n_workers, on_tick, session.total_rows, runner)
            stats = RunStats.merge(driver.run(), wall_s=driver.processing_s())
            extra = {
                "job_wall_s": round(time.time() - started, 3),  # with Ray start-up and model loading
                "workers": n_workers,
                "worker_restarts": driver.state.deaths,
                "ray_address": _address(cluster),
            }
        finally:
            if cluster.started_here:
                cluster.ray.shutdown()
        report = session.finalize(stats, extra)
    if report.get("complete") is False:
        print(
            f"bulkrun: every slice finished, yet {report.get('remaining')} rows are missing from "
            f"{report.get('out')}: the workers do not write where the driver reads. Use a directory "
            "shared by all nodes, or a URI (s3://...) for --out.",
            file=sys.stderr,
        )
    return report


def _absolute_paths(spec: Any) -> Any:
    """Local paths (input, out, a model folder) made absolute; URIs and model aliases left alone."""
    if not dataclasses.is_dataclass(spec):
        return spec
    changes = {}
    for name in ("input", "out", "model"):
        value = getattr(spec, name, None)
        if isinstance(value, str) and not is_uri(value) and (name == "out" or os.path.exists(value)):
            changes[name] = os.path.abspath(value)
    return dataclasses.replace(spec, **changes) if changes else spec


def _address(cluster: Cluster) -> str | None:
    try:
        return cluster.ray.get_runtime_context().gcs_address
    except Exception:  # Ray Client (ray://) has no local runtime context
        return None


def _worker_count(cluster: Cluster, wanted: int | None) -> int:
    if wanted:
        return wanted
    return max(1, int(cluster.num_gpus))


class _Driver:
    def __init__(
        self, spec: Any, cluster: Cluster, n_workers: int, on_tick: Any, total: int | None, runner: str
    ):
        self.ray = cluster.ray
        self.spec = spec
        self.runner = runner
        self.n_workers = n_workers
        self.on_tick = on_tick
        self.resources = _worker_resources(cluster, n_workers)
        self.restart_budget = 2 * n_workers + 2
        self.pending: deque[Partition] = deque(all_partitions(n_workers))
        self.busy: dict[Any, WorkerSlot] = {}  # run_slice ref -> worker
        self.starting: dict[Any, WorkerSlot] = {}  # ready ref -> worker
        self.idle: list[WorkerSlot] = []
        self.stats: dict[Partition, RunStats] = {}
        self.state = DriverState(workers=[])
        self.attempts = 0
        self.first_slice_at: float | None = None  # processing time: first slice handed out ...
        self.last_slice_at: float | None = None  # ... to the last slice finished
        self.board = self.ray.remote(num_cpus=0)(ProgressBoard).remote()
        self.actor_class = self.ray.remote(SliceWorker)
        self.bar = _progress_bar(spec, total)

    def run(self) -> list[RunStats]:
        try:
            for _ in range(self.n_workers):
                self._start_worker()
            while self.pending or self.busy:
                self._assign()
                if not self.busy and not self.starting:
                    raise WorkersKeepDying("no worker is left to run the remaining slices")
                done, _ = self.ray.wait([*self.busy, *self.starting], num_returns=1, timeout=POLL_S)
                for ref in done:
                    self._collect(ref)
                self._tick()
            self._tick()
            return [self.stats[p] for p in all_partitions(self.n_workers)]
        finally:
            self.bar.close()
            for slot in self.state.workers:
                self.ray.kill(slot.handle)
            self.ray.kill(self.board)

    def processing_s(self) -> float:
        if self.first_slice_at is None or self.last_slice_at is None:
            return 0.0
        return self.last_slice_at - self.first_slice_at

    def _start_worker(self) -> None:
        handle = self.actor_class.options(**self.resources).remote(self.spec, self.board, self.runner)
        slot = WorkerSlot(handle, number=len(self.state.workers))
        self.state.workers.append(slot)
        self.starting[handle.ready.remote()] = slot

    def _assign(self) -> None:
        while self.idle and self.pending:
            slot = self.idle.pop()
            slot.partition = self.pending.popleft()
            self.first_slice_at = self.first_slice_at or time.monotonic()
            self.attempts += 1
            slot.attempt = f"{slot.partition.tag}#{self.attempts}"
            self.busy[slot.handle.run_slice.remote(slot.partition, slot.attempt)] = slot

    def _collect(self, ref: Any) -> None:
        """A worker became ready, finished a slice, failed (a job error: stop) or died (retry)."""
        slot = self.starting.pop(ref, None) or self.busy.pop(ref)
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:
            if exc.actor_init_failed:  # could not even unpickle its arguments: the same every time
                raise WorkerStartFailed(f"a Ray worker could not start: {_summary(exc)}") from None
            self._worker_died(slot, exc)
            return
        except self.ray.exceptions.RayTaskError as exc:
            raise _original_error(exc) from None  # bad input, unloadable model...: the same everywhere
        if slot.partition is not None:
            self.stats[slot.partition] = result
            self.state.slices_done += 1
            self.last_slice_at = time.monotonic()
            slot.partition = None
        else:
            slot.info = result
            self._say(
                f"worker {slot.number} ready on {result['host']} ({result['device']}, pid {result['pid']})"
            )
        self.idle.append(slot)

    def _worker_died(self, slot: WorkerSlot, exc: Exception) -> None:
        """Put its slice back at the front of the queue and start a replacement."""
        self.state.deaths += 1
        self.state.workers.remove(slot)
        if slot.partition is not None:
            self.pending.appendleft(slot.partition)
            self.ray.get(self.board.drop.remote(slot.attempt))  # its replacement re-reports
        if self.state.deaths > self.restart_budget:
            raise WorkersKeepDying(f"{self.state.deaths} workers died; the last: {_summary(exc)}")
        self._say(f"worker {slot.number} died ({_summary(exc)}); starting a replacement")
        self._start_worker()

    def _say(self, line: str) -> None:
        if not getattr(self.spec, "quiet", False):
            self.bar.write(f"bulkrun: {line}", file=sys.stderr)

    def _tick(self) -> None:
        items, tokens = self.ray.get(self.board.totals.remote())
        self.state.items_done, self.state.tokens = items, tokens
        if items != self.bar.n:  # may go back when a dead worker's counts are dropped
            self.bar.set_postfix(tokens=tokens, workers=len(self.busy), refresh=False)
            self.bar.update(items - self.bar.n)
        if self.on_tick is not None:
            self.on_tick(self.state)


class ProgressBoard:
    """Progress of a Ray job, in a tiny actor: workers push counts, the driver reads one total.

    Counts are kept per slice attempt. A slice's first report is the number of its rows already
    committed (resume), so the total is "rows done", and when an attempt dies the driver drops that
    attempt's counts: its replacement reports the committed ones again and redoes the rest."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}

    def add(self, attempt: str, items: int, tokens: int) -> None:
        counts = self._counts.setdefault(attempt, [0, 0])
        counts[0] += items
        counts[1] += tokens

    def drop(self, attempt: str) -> None:
        self._counts.pop(attempt, None)

    def totals(self) -> tuple[int, int]:
        return sum(c[0] for c in self._counts.values()), sum(c[1] for c in self._counts.values())


def _worker_resources(cluster: Cluster, n_workers: int) -> dict:
    """One GPU per worker where the cluster has GPUs, else an even share of its CPUs."""
    if cluster.num_gpus >= 1:
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": max(1, int(cluster.num_cpus // n_workers))}


def _progress_bar(spec: Any, total: int | None) -> Any:
    from tqdm import tqdm

    quiet = bool(getattr(spec, "quiet", False))
    return tqdm(total=total, unit="item", desc="bulkrun (ray)", file=sys.stderr, disable=quiet)


def _original_error(exc: Exception) -> Exception:
    """The exception a worker raised, unwrapped from Ray's envelopes where Ray kept it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        return _original_error(cause)
    as_cause = getattr(exc, "as_instanceof_cause", None)
    return as_cause() if callable(as_cause) else exc


def _summary(exc: Exception) -> str:
    """One line about a Ray error: the innermost "XxxError: ..." line if there is one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    if errors:
        return errors[-1]
    return lines[0] if lines else type(exc).__name__
