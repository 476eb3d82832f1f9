"""Job commands: generate, summarize, and run (a TOML job spec)."""

from __future__ import annotations

from pathlib import Path

import click

from bulkrun.cli.app import INPUT, app
from bulkrun.cli.execute import execute, run_task_command
from bulkrun.cli.options import JOB_OPTIONS, opt, options
from bulkrun.errors import UsageError
from bulkrun.job.spec import normalize_key, spec_from_file


@app.command()
@INPUT
@options(JOB_OPTIONS)
def generate(input: Path, opts: dict) -> int:
    """Generate text for every row (use --n for several samples per row: synthetic data).

    The prompt is the row's --text-field, or --prompt-template filled from its fields. OpenAI batch
    files are detected and answered in OpenAI's output format (output.jsonl, errors.jsonl).
    """
    return run_task_command("generate", input, opts)


SUMMARIZE_OPTIONS = [
    opt("instruction", str, "--instruction", help="Instruction placed before each text."),
]
RUN_SPEC_OPTIONS = [
    opt("input", str, "--input", "-i", help="Input file (overrides the spec's)."),
    opt("set", list[str], "--set", help="Override any spec key: --set key=value (repeatable)."),
]


@app.command()
@INPUT
@options(JOB_OPTIONS, SUMMARIZE_OPTIONS)
def summarize(input: Path, opts: dict) -> int:
    """Summarize the text of every row (default max tokens 160)."""
    return run_task_command("summarize", input, opts)


@app.command()
@click.argument("spec", type=click.Path(path_type=Path), metavar="SPEC")
@options(RUN_SPEC_OPTIONS, JOB_OPTIONS)
def run(spec: Path, opts: dict) -> int:
    """Run a job spec (TOML: task, input, and any option), e.g. `bulkrun run
    jobs/classify-tickets.toml` (what a cron line calls).

    Flags given here override the spec's values; a rerun resumes where the last run stopped.
    """
    overrides = dict(opts)
    overrides.update(parse_sets(overrides.pop("set", [])))
    return execute(spec_from_file(spec, overrides))


def parse_sets(items: list[str]) -> dict:
    """`key=value` pairs; the value is read as a TOML value when it is one (numbers, lists,
    true/false, quoted strings), else taken as a plain string."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    values = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects key=value, got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        values[normalize_key(key.strip())] = value
    return values
