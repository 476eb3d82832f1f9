"""From parsed options to a finished job: build the spec, run it (locally, as a slice, or on Ray),
print the summary, and return the exit code. Commands stay thin by calling `run_task_command`."""

from __future__ import annotations

import sys
from pathlib import Path

from bulkrun.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_ROW_ERRORS, UsageError
from bulkrun.io.outdir import is_uri
from bulkrun.job.spec import JobSpec, build_spec


def run_task_command(
    task: str, input: Path | str | None, opts: dict, task_options: dict | None = None
) -> int:
    """What a job command does: its task, its input argument, the shared options given on the
    command line (`opts` from options()) and the task's own options (None = not given)."""
    values = {"task": task, "input": None if input is None else str(input), **opts, **(task_options or {})}
    return execute(build_spec([("the command line", values)]))


def execute(spec: JobSpec) -> int:
    from bulkrun.distributed.options import check_exec_options
    from bulkrun.tasks.sweep import is_sweep

    check_exec_options(spec.ray, spec.workers, spec.shard)
    if spec.task == "eval" and is_sweep(spec.task_options):
        return _sweep(spec)
    if spec.ray is not None:
        from bulkrun.distributed.ray_driver import run_on_ray

        report = run_on_ray(spec)
    elif is_uri(spec.out):  # s3://, gs://, ...: run on a local mirror (bulkrun.distributed.uri)
        from bulkrun.distributed.uri import run_job_at_uri

        report = run_job_at_uri(spec)
    else:
        from bulkrun.job.runner import run_job

        report = run_job(spec)
    if not spec.quiet:
        from bulkrun.job.stats import summary_lines

        print("\n".join(summary_lines(report)), file=sys.stderr)
    return exit_code(report, sliced=spec.shard is not None)


def exit_code(report: dict, sliced: bool = False) -> int:
    """0 all rows done; 3 done with row errors; 8 rows remain (a whole job that did not finish).
    A --shard slice looks at its own rows only."""
    if sliced:
        return EXIT_ROW_ERRORS if report.get("selection_errors_total") else EXIT_OK
    if not report.get("complete", False):
        return EXIT_INCOMPLETE
    return EXIT_ROW_ERRORS if report.get("errors_total") else EXIT_OK


def _sweep(spec: JobSpec) -> int:
    """An eval sweep: one ordinary (resumable) job per combination, then a comparison table."""
    from bulkrun.job.runner import run_job
    from bulkrun.job.session import load_engine
    from bulkrun.tasks.sweep import SweepError, markdown_table, run_sweep

    if spec.ray is not None or spec.shard is not None:
        raise UsageError("an eval sweep runs its combinations one after another here; drop --ray/--shard")
    has_labels = bool(spec.task_options.get("labels") or spec.task_options.get("labels_file"))
    codes = []

    def run_one(child: JobSpec, engine=None) -> dict:
        report = run_job(child, engine=engine)
        codes.append(exit_code(report))
        return report

    try:
        rows = run_sweep(spec, run_one, build_engine=load_engine, has_labels=has_labels)
    except SweepError as exc:
        raise UsageError(str(exc)) from None
    if not spec.quiet:
        print(markdown_table(rows), file=sys.stderr, end="")
    return max(codes, default=EXIT_OK)
