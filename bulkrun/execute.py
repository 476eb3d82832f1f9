"""Running a JobSpec: the one door the CLI and the Python API both go through.

`run_spec` runs one job where its spec says (in this process, as a --shard slice, on Ray, or at a
URI) and returns its report; `run_sweep_spec` runs an eval sweep, one job per combination. Errors
are the library's (bulkrun.exceptions): the CLI turns them into a line and an exit code, the API
lets them propagate. A model loaded by one job is kept for the next job of this process with the
same model directory, device, dtype and kernels (bulkrun.engine.worker.loaded_model), so a notebook's
repeated `bulkrun.run(...)` calls and a sweep's runs over one model load it once.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from bulkrun.distributed.options import check_exec_options
from bulkrun.exceptions import UsageError
from bulkrun.io.outdir import is_uri
from bulkrun.job.spec import JobSpec
from bulkrun.tasks.sweep import is_sweep


def is_sweep_spec(spec: JobSpec) -> bool:
    return spec.task == "eval" and is_sweep(spec.task_options)


def run_spec(spec: JobSpec) -> dict:
    """Run one job (not a sweep) locally, as a --shard slice, on Ray or at a URI; its report."""
    check_exec_options(spec.ray, spec.workers, spec.shard)
    _free_the_last_job()
    if spec.ray is not None:
        from bulkrun.distributed.ray_driver import run_on_ray

        return run_on_ray(spec)
    if is_uri(spec.out):  # s3://, gs://, ...: run on a local mirror (bulkrun.distributed.uri)
        from bulkrun.distributed.uri import run_job_at_uri

        return run_job_at_uri(spec)
    from bulkrun.job.runner import run_job

    return run_job(spec)


def run_sweep_spec(spec: JobSpec, on_report: Callable[[dict], None] | None = None) -> list[dict]:
    """An eval sweep: one ordinary (resumable) job per combination, in this process; the sweep's
    rows (as in OUT/sweep.json). `on_report` sees each run's report as it finishes."""
    from bulkrun.job.runner import run_job
    from bulkrun.job.sweep import run_sweep

    check_exec_options(spec.ray, spec.workers, spec.shard)
    if spec.ray is not None or spec.shard is not None:
        raise UsageError("an eval sweep runs its combinations one after another here; drop --ray/--shard")

    def run_one(child: JobSpec) -> dict:
        _free_the_last_job()
        report = run_job(child)
        if on_report is not None:
            on_report(report)
        return report

    return run_sweep(spec, run_one)


def _free_the_last_job() -> None:
    """The engine of this process's last job (its KV cache) may wait in reference cycles for a
    collection; free it before the next job sizes its KV cache from the memory that is free."""
    gc.collect()
