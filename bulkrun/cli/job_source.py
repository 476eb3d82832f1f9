"""INPUT|SPEC: commands that look at a job without running it (plan, batch prepare) take either an
input file (with --task and the job's flags) or a TOML job spec (flags override it), and build the
same JobSpec the job commands build."""

from __future__ import annotations

from pathlib import Path

from bulkrun.job.spec import JobSpec, build_spec, spec_from_file


def job_spec(source: Path, values: dict) -> JobSpec:
    """The JobSpec of `source` with the command line's values on top, exactly as the job would get it."""
    if Path(source).suffix == ".toml":
        return spec_from_file(Path(source), values)
    return build_spec([("the command line", {"task": "generate", "input": str(source), **values})])
