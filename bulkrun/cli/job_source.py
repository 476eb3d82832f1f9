"""INPUT|SPEC: commands that look at a job without running it (plan, export-batch) take either an input
file (with --task and the job's flags) or a TOML job spec (flags override it), and build the same
JobSpec the job commands build."""

from __future__ import annotations

from pathlib import Path

import typer

from bulkrun.cli.jobs import parse_sets
from bulkrun.job.spec import JobSpec, build_spec, spec_from_file

SOURCE = typer.Argument(
    ...,
    help="Input file (.jsonl, .parquet, .csv, OpenAI batch .jsonl) or a job spec (.toml).",
    show_default=False,
)
TASK = typer.Option(None, "--task", help="The job's task when SOURCE is an input file (default: generate).")
SETS = typer.Option(
    None, "--set", help="Any other spec key, e.g. a task option: --set labels=[...] (repeatable)."
)


def job_spec(source: Path, task: str | None, sets: list[str] | None, opts: dict) -> JobSpec:
    """The JobSpec of `source` with the command line's values on top, exactly as the job would get it."""
    values = dict(opts) | parse_sets(sets or [])
    if task is not None:
        values["task"] = task
    if Path(source).suffix == ".toml":
        return spec_from_file(Path(source), values)
    return build_spec([("the command line", {"task": "generate", "input": str(source), **values})])
