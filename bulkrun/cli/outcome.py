"""A job command's outcome: run its JobSpec through bulkrun.execute, print the summary (or a sweep's
table) on stderr unless --quiet, and return the exit code."""

from __future__ import annotations

import sys

from bulkrun.exceptions import EXIT_INCOMPLETE, EXIT_OK, EXIT_ROW_ERRORS
from bulkrun.execute import is_sweep_spec, run_spec, run_sweep_spec
from bulkrun.job.spec import JobSpec, build_spec


def run_task_command(task: str, values: dict) -> int:
    """A job command: its task and the spec keys the command line gives (options.spec_values)."""
    return run_job_command(build_spec([("the command line", {"task": task, **values})]))


def run_job_command(spec: JobSpec) -> int:
    if is_sweep_spec(spec):
        return _sweep(spec)
    report = run_spec(spec)
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
    """The worst of the runs' exit codes."""
    from bulkrun.tasks.sweep import markdown_table

    codes = []
    rows = run_sweep_spec(spec, lambda report: codes.append(exit_code(report)))
    if not spec.quiet:
        print(markdown_table(rows), file=sys.stderr, end="")
    return max(codes, default=EXIT_OK)
