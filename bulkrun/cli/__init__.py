"""The `bulkrun` command line, a typer app. It only parses, builds a JobSpec and calls the library
(bulkrun.execute); library errors become one clean line and an exit code at its edge
(bulkrun/cli/app.py; the codes: bulkrun/exceptions.py).

Command modules register on `bulkrun.cli.app.app`; their options are the typed aliases of
bulkrun/cli/options.py.
"""

from __future__ import annotations

import importlib
import signal
import sys

from bulkrun.cli.app import app

# Each registers its commands on `app`, in this order (the order of `bulkrun --help`).
for _name in ("jobs", "classify", "embed", "eval", "outdir", "plan", "batch"):
    importlib.import_module(f"bulkrun.cli.{_name}")


def _terminate(signum, frame):  # SIGTERM behaves like Ctrl-C: commit what is finished, then stop
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """The console script (argv None: the process's own arguments, ending the process) or an
    in-process call (returns the exit code)."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app(args=argv, prog_name="bulkrun")
        code = 0
    except SystemExit as exc:  # typer ends every run with the command's exit code
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if argv is None:
        _exit(code)
    return code


def _exit(code: int) -> None:
    """End the process. Everything a job writes is committed (closed, renamed, fsynced) before its
    command returns, so what is left is the interpreter's teardown: freeing the model, the KV cache
    and torch's and oneDNN's state takes a noticeable part of a small job, and nothing needs it.
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


__all__ = ["app", "main"]
