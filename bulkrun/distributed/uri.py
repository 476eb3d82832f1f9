"""Jobs whose --out is a URI (s3://bucket/run, gs://..., file:///...): run, export and status.

Each entry point runs the ordinary job-layer function on a private local mirror (see io/mirror.py)
and reports the URI as the job's `out`. The Ray driver and workers use `driver_session_at_uri` and
`run_slice_at_uri` the same way (ray_worker.py picks them for URI outputs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bulkrun.io.atomic import write_json_atomic
from bulkrun.io.mirror import MANIFEST, RemoteMirror, staged, uri_out
from bulkrun.job.session import FINAL_FILES, JOB_DIRS, SINGLE, open_job
from bulkrun.job.slices import Partition, parse_shard
from bulkrun.job.stats import RunStats

_FINAL_FILES = tuple(name for name in FINAL_FILES if name != MANIFEST)
_RESTART_WIPE = (FINAL_FILES, JOB_DIRS)


def _local(spec: Any, mirror: RemoteMirror) -> Any:
    return dataclasses.replace(spec, out=str(mirror.local))


def _publish(mirror: RemoteMirror, report: dict) -> dict:
    """Name the URI as the job's out in report.json and upload the final files."""
    report = dict(report, out=mirror.uri)
    if (mirror.local / "report.json").exists():
        write_json_atomic(mirror.local / "report.json", report)
    mirror.push_files(list(_FINAL_FILES))
    return report


def run_job_at_uri(spec: Any) -> dict:
    """A single-process run or one --shard slice, writing to a URI."""
    from bulkrun.job.runner import run_job

    partition = parse_shard(spec.shard) if spec.shard else None
    writer = SINGLE if partition is None else partition.tag
    wipe = _RESTART_WIPE if spec.restart and partition is None else None
    with staged(uri_out(spec), writer=writer, lock=True, wipe=wipe) as mirror:
        report = run_job(_local(spec, mirror))
        mirror.push()
        return _publish(mirror, report) if partition is None else dict(report, out=mirror.uri)


def run_slice_at_uri(spec: Any, partition: Partition, run: Callable[[Any], RunStats]) -> RunStats:
    """A Ray worker's slice: `run(local_spec)` on a mirror; the driver holds the lock."""
    with staged(uri_out(spec), writer=partition.tag, lock=False) as mirror:
        return run(_local(spec, mirror))


class _UriSession:
    """The Ray driver's session on a mirror: finalize pulls every worker's shards first."""

    def __init__(self, session: Any, mirror: RemoteMirror):
        self._session = session
        self._mirror = mirror

    @property
    def total_rows(self) -> int | None:
        return self._session.total_rows

    def finalize(self, stats: RunStats, extra: dict | None = None) -> dict:
        self._mirror.pull()
        return _publish(self._mirror, self._session.finalize(stats, extra))


@contextmanager
def driver_session_at_uri(spec: Any) -> Iterator[_UriSession]:
    wipe = _RESTART_WIPE if spec.restart else None
    with staged(uri_out(spec), writer=SINGLE, lock=True, wipe=wipe) as mirror:
        with open_job(_local(spec, mirror)) as session:
            mirror.push_files([MANIFEST])  # workers check their job against it when they start
            yield _UriSession(session, mirror)


def export_at_uri(out: str, fmt: str | None = None, force: bool = False) -> dict:
    """`bulkrun export s3://...`: merge on a mirror, upload the final files."""
    from pathlib import Path

    from bulkrun.job.export import export_job

    with staged(out, writer="export", lock=False) as mirror:
        report = export_job(Path(mirror.local), fmt, force)
        return _publish(mirror, report)


def status_at_uri(out: str) -> dict:
    """`bulkrun status s3://...` from a mirror of the committed shards (live runs: see the lock files)."""
    from pathlib import Path

    from bulkrun.job.status import job_status

    with staged(out, writer="status", lock=False, every_s=3600) as mirror:
        return dict(job_status(Path(mirror.local)), out=out)
