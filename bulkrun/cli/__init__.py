"""The `bulkrun` command line. The CLI only parses, builds a JobSpec and calls the library; library
errors become one clean line and an exit code here, at the edge (codes: see bulkrun/errors.py).

Command modules register on `bulkrun.cli.app.app`; job commands take the shared options with
`bulkrun.cli.options.with_options(JOB_OPTIONS)` and call `bulkrun.cli.execute.run_task_command`.
"""

from __future__ import annotations

import importlib
import signal
import sys

import typer

from bulkrun.cli.app import app
from bulkrun.errors import EXIT_FATAL, EXIT_INTERRUPTED, EXIT_USAGE, BulkrunError

_COMMAND_MODULES = ("jobs", "classify", "eval", "outdir")


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
    from bulkrun.distributed.options import fix_bare_ray_flag

    args = fix_bare_ray_flag(list(sys.argv[1:] if argv is None else argv))
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = app(args=args, prog_name="bulkrun", standalone_mode=False)
        if code == EXIT_INTERRUPTED:  # typer turned Ctrl-C / SIGTERM into this exit code
            code = _interrupted()
    except typer.Exit as exc:
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        code = _interrupted()
    except typer.TyperException as exc:  # typer's (vendored click) usage errors: show them as click does
        exc.show()
        code = getattr(exc, "exit_code", EXIT_USAGE)
    except BulkrunError as exc:
        print(f"bulkrun: error: {exc}", file=sys.stderr)
        code = exc.exit_code
    except BrokenPipeError:
        code = EXIT_FATAL
    code = code if isinstance(code, int) else 0
    if argv is None:
        sys.exit(code)
    return code


def _interrupted() -> int:
    print(
        "\nbulkrun: interrupted; committed results are kept, rerun the same command to resume",
        file=sys.stderr,
    )
    return EXIT_INTERRUPTED


__all__ = ["app", "main"]
