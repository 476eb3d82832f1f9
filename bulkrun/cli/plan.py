"""`bulkrun plan`: what a job will take (rows, tokens, time, memory, provider cost) before it runs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from bulkrun.cli.app import app
from bulkrun.cli.job_source import SETS, SOURCE, TASK, job_spec
from bulkrun.cli.options import JOB_OPTIONS, with_options
from bulkrun.errors import EXIT_OK, UsageError


@app.command()
@with_options(JOB_OPTIONS)
def plan(
    source: Path = SOURCE,
    task: str = TASK,
    set_: list[str] = SETS,
    prices: Path = typer.Option(None, "--prices", help="Provider batch price table (TOML; see README)."),
    sample: int = typer.Option(None, "--sample", help="Rows run on the engine to measure it (default 32)."),
    no_sample: bool = typer.Option(False, "--no-sample", help="Run nothing: token counts and bounds only."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    opts: dict = None,
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
    spec = job_spec(source, task, set_, opts)
    estimate = plan_job(spec, sample=0 if no_sample else sample or DEFAULT_SAMPLE, prices=prices)
    typer.echo(json.dumps(estimate.as_dict(), indent=2) if as_json else format_plan(estimate))
    return EXIT_OK
