"""The click group every command module registers on (import `app` from here)."""

from __future__ import annotations

from pathlib import Path

import click

from bulkrun import __version__

# The positional argument of the job commands.
INPUT = click.argument("input", type=click.Path(path_type=Path), metavar="INPUT")


@click.group(
    name="bulkrun",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(
    __version__, "--version", "-V", message="bulkrun %(version)s", help="Show the version and exit."
)
def app() -> None:
    """Offline bulk LLM inference: classify, generate, summarize and evaluate whole files on a
    continuous-batching engine, with resumable, checkpointed results.

    INPUT of the job commands: a .jsonl, .parquet or .csv file, or an OpenAI batch .jsonl.
    Exit codes: see `bulkrun.exceptions` (0 ok, 3 finished with row errors)."""
