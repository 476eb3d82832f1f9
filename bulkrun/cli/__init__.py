"""The `bulkrun` command line. The CLI only parses, builds a JobSpec and calls the library; library
errors become one clean line and an exit code here, at the edge (codes: see bulkrun/exceptions.py).

Command modules register on the click group `bulkrun.cli.app.app`; job commands take the shared
options with `bulkrun.cli.options.options(JOB_OPTIONS, ...)` and call
`bulkrun.cli.execute.run_task_command`.
"""

from __future__ import annotations

import importlib
import signal
import sys

import click

from bulkrun.cli.app import app
from bulkrun.cli.daemon_client import run_in_daemon
from bulkrun.exceptions import EXIT_FATAL, EXIT_INTERRUPTED, BulkrunError

_COMMAND_MODULES = ("jobs", "classify", "embed", "eval", "outdir", "plan", "provider_batch", "daemon")


def _register_commands() -> None:
    for name in _COMMAND_MODULES:
        try:
            importlib.import_module(f"bulkrun.cli.{name}")
        except ModuleNotFoundError as exc:  # a command module not written yet (classify/eval)
            if exc.name != f"bulkrun.cli.{name}":
                raise


_register_commands()


def _terminate(signum, frame):  # SIGTERM behaves like Ctrl-C: commit what is finished, then stop
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:  # the command line itself: a resident daemon may run it (daemon_client.py)
        code = run_in_daemon(args)
        if code is not None:
            _exit(code)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        # standalone_mode=False: click returns the command's exit code and raises the rest here
        code = app.main(args=args, prog_name="bulkrun", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except (click.Abort, KeyboardInterrupt):  # click turns Ctrl-C / SIGTERM into Abort
        code = _interrupted()
    except click.ClickException as exc:  # usage errors: shown as click shows them
        exc.show()
        code = exc.exit_code
    except BulkrunError as exc:
        print(f"bulkrun: error: {exc}", file=sys.stderr)
        code = exc.exit_code
    except BrokenPipeError:
        code = EXIT_FATAL
    code = code if isinstance(code, int) else 0
    if argv is None:
        _exit(code)
    return code


def _exit(code: int) -> None:
    """End the process. Everything a job writes is committed (closed, renamed, fsynced) before its
    command returns, so what is left is the interpreter's teardown: freeing the model, the KV cache
    and torch's and oneDNN's state costs 0.7 s of a one-row job on the dev box, and nothing needs it.
    A run that used Ray leaves its shutdown to the normal exit (Ray's atexit handler)."""
    if "ray" in sys.modules:
        sys.exit(code)
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader
            pass
    os._exit(code)


def _interrupted() -> int:
    print(
        "\nbulkrun: interrupted; committed results are kept, rerun the same command to resume",
        file=sys.stderr,
    )
    return EXIT_INTERRUPTED


__all__ = ["app", "main"]
