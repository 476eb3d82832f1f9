"""INPUT|SPEC: commands that look at a job without running it (plan, export-batch) take either an input
file (with --task and the job's flags) or a TOML job spec (flags override it), and build the same
JobSpec the job commands build."""

from __future__ import annotations

from pathlib import Path

import click

from bulkrun.cli.jobs import parse_sets
from bulkrun.cli.options import opt
from bulkrun.job.spec import JobSpec, build_spec, spec_from_file

SOURCE = click.argument("source", type=click.Path(path_type=Path), metavar="INPUT|SPEC")
SOURCE_OPTIONS = [
    opt("task", str, "--task", help="The job's task when SOURCE is an input file (default: generate)."),
    opt("set", list[str], "--set", help="Any other spec key, e.g. a task option: --set labels=[...] (repeatable)."),
]  # fmt: skip


def job_spec(source: Path, opts: dict) -> JobSpec:
    """The JobSpec of `source` with the command line's values on top, exactly as the job would get it."""
    values = dict(opts)
    values.update(parse_sets(values.pop("set", None) or []))
    if Path(source).suffix == ".toml":
        return spec_from_file(Path(source), values)
    return build_spec([("the command line", {"task": "generate", "input": str(source), **values})])
