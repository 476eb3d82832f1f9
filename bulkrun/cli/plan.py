"""`bulkrun plan`: what a job will take (rows, tokens, time, memory, provider cost) before it runs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from bulkrun.cli.app import app
from bulkrun.cli.job_source import SOURCE, SOURCE_OPTIONS, job_spec
from bulkrun.cli.options import JOB_OPTIONS, options
from bulkrun.exceptions import EXIT_OK, UsageError


@app.command()
@SOURCE
@options(SOURCE_OPTIONS, JOB_OPTIONS)
@click.option(
    "--prices", type=click.Path(path_type=Path), help="Provider batch price table (TOML; see README)."
)
@click.option("--sample", type=int, help="Rows run on the engine to measure it (default 32).")
@click.option("--no-sample", is_flag=True, help="Run nothing: token counts and bounds only.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(
    source: Path, prices: Path | None, sample: int | None, no_sample: bool, as_json: bool, opts: dict
) -> int:
    """Estimate a job without running it: rows and bad rows, prompt tokens, shared prefix, generated
    tokens, wall time on this machine (from a short sample run), KV memory, and provider batch cost.

    Takes the same options as the job: `bulkrun plan tickets.jsonl --max-tokens 128 --prices p.toml`.
    Nothing is written to the output directory.
    """
    from bulkrun.job.plan import DEFAULT_SAMPLE, plan_job
    from bulkrun.job.plan_estimate import format_plan

    if no_sample and sample:
        raise UsageError("--sample and --no-sample contradict each other")
    if sample is not None and sample < 1:
        raise UsageError(f"--sample must be >= 1, got {sample}")
    spec = job_spec(source, opts)
    estimate = plan_job(spec, sample=0 if no_sample else sample or DEFAULT_SAMPLE, prices=prices)
    click.echo(json.dumps(estimate.as_dict(), indent=2) if as_json else format_plan(estimate))
    return EXIT_OK
