"""The typer application every command module registers on (import `app` from here)."""

from __future__ import annotations

import typer

from bulkrun import __version__

app = typer.Typer(
    name="bulkrun",
    help=(
        "Offline bulk LLM inference: classify, generate, summarize and evaluate whole files on a "
        "continuous-batching engine, with resumable, checkpointed results."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bulkrun {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", "-V", help="Show the version and exit.", callback=_version, is_eager=True
    ),
) -> None:
    """Offline bulk LLM inference. Exit codes: see `bulkrun.errors` (0 ok, 3 finished with row errors)."""
