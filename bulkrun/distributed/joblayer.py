"""The distributed runners' one door into the job layer (bulkrun.job): what a slice run needs.

Ray workers and the driver reach the job layer only through the three functions here (`build_engine`,
`run_slice`, `driver_session`), so tests can swap in another module with the same three names
(`run_on_ray(spec, runner="module")`) and the job layer's names are wired in one place. An output
URI (s3://...) is handled here too: the job layer then works on a local mirror (uri_jobs.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bulkrun.distributed.partition import Partition
from bulkrun.distributed.remote_out import uri_out


def build_engine(spec: Any) -> Any:
    """Load the job's engine once per worker."""
    from bulkrun.job.runner import build_engine as job_build_engine

    return job_build_engine(spec)


def run_slice(spec: Any, partition: Partition, engine: Any, on_progress: Callable[[int, int], None]) -> dict:
    """Run one slice to the end (resuming from committed shards) and return its report."""
    from bulkrun.job.runner import run_job

    def run(local_spec: Any) -> dict:
        return run_job(
            local_spec,
            partition=partition,
            engine=engine,
            lock=False,
            finalize=False,
            on_progress=on_progress,
        )

    if uri_out(spec):
        from bulkrun.distributed.uri_jobs import run_slice_at_uri

        return run_slice_at_uri(spec, partition, run)
    return run(spec)


@contextmanager
def driver_session(spec: Any) -> Iterator[Any]:
    """Lock OUT, check or write the manifest; yields an object with `total_rows` and `finalize(report)`."""
    if uri_out(spec):
        from bulkrun.distributed.uri_jobs import driver_session_at_uri as session_for
    else:
        from bulkrun.job.runner import job_session as session_for

    with session_for(spec) as session:
        yield session
