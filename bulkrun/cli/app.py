"""The typer app every command module registers on (import `app` from here), and the CLI's edge:
a command returns its exit code, and a library error (bulkrun.exceptions) becomes one line on stderr
and its exit code, here and nowhere else."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from bulkrun import __version__
from bulkrun.exceptions import EXIT_CODES, EXIT_FATAL, EXIT_INTERRUPTED, EXIT_OK, BulkrunError

# Plain help (no markup: help texts hold brackets such as [...]) at the terminal's width, at most 80.
PLAIN = {
    "rich_markup_mode": None,
    "add_completion": False,
    "pretty_exceptions_enable": False,
    "no_args_is_help": True,
}
EPILOG = "\b\nExit codes (stable; scripts may rely on them):\n" + "\n".join(
    f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items()
)


class BulkrunGroup(TyperGroup):
    """The top-level group: runs the command, then ends with its exit code."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            code = super().invoke(ctx)
        except BulkrunError as exc:
            print(f"bulkrun: error: {exc}", file=sys.stderr)
            code = exc.exit_code
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (bulkrun.cli.main turns it into this)
            print(
                "\nbulkrun: interrupted; committed results are kept, rerun the same command to resume",
                file=sys.stderr,
            )
            code = EXIT_INTERRUPTED
        except BrokenPipeError:  # the reader of our output went away
            code = EXIT_FATAL
        ctx.exit(code if isinstance(code, int) else EXIT_OK)


app = typer.Typer(
    name="bulkrun",
    cls=BulkrunGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EPILOG,
    **PLAIN,
)


def _show_version(value: bool) -> None:
    if value:
        print(f"bulkrun {__version__}")
        raise typer.Exit()


@app.callback()
def bulkrun(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_show_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Offline bulk LLM inference: classify, generate, summarize, evaluate and embed whole files on a
    continuous-batching engine, with resumable, checkpointed results.

    INPUT of the job commands: a .jsonl, .parquet or .csv file, or an OpenAI batch .jsonl.
    """
