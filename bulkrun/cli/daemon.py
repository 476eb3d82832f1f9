"""`bulkrun daemon start|stop|status`: a resident process that makes every later command start at once.

While a daemon is up, a `bulkrun` command from the same installation and environment runs in a
child forked from it (daemon_client.py, daemon_server.py): no `import torch`, no model load.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import click

from bulkrun.cli import daemon_client as client
from bulkrun.cli.app import app
from bulkrun.exceptions import EXIT_FATAL, EXIT_OK, UsageError

_START_LIMIT_S = 600.0  # a first run may convert the default model's GGUF file


@app.group()
def daemon() -> None:
    """A resident process that keeps torch and the model loaded, so that each later `bulkrun`
    command from this environment starts in a fraction of a second instead of seconds.

    Commands find it by themselves and run exactly as they would alone (their own arguments,
    folder, environment and terminal; Ctrl-C and exit codes as usual). BULKRUN_NO_DAEMON=1 makes a
    command run in its own process anyway."""


@daemon.command()
@click.option("--model", default=None, help="Model to keep loaded (default: the default model).")
@click.option("--no-model", is_flag=True, help="Keep only the imports loaded, no model.")
@click.option(
    "--idle-minutes",
    type=float,
    default=30.0,
    show_default=True,
    help="Stop after this long without a command.",
)
def start(model: str | None, no_model: bool, idle_minutes: float) -> int:
    """Start this environment's daemon in the background and wait until it takes commands."""
    if idle_minutes <= 0:
        raise UsageError(f"--idle-minutes must be positive, got {idle_minutes}")
    folder = _folder()
    key = client.installation_key()
    path = client.socket_path(folder, key)
    running = client.ask(path, "status")
    if running is not None:
        click.echo(f"bulkrun daemon: already running (pid {running['pid']})")
        return EXIT_OK
    log_path = folder / f"{key}.log"
    cmd = [sys.executable, "-m", "bulkrun.cli.daemon_server", "--socket", str(path),
           "--idle-timeout", str(idle_minutes * 60.0), *(["--model", model] if model else []),
           *(["--no-model"] if no_model else [])]  # fmt: skip
    t0 = time.perf_counter()
    with open(log_path, "ab") as log:
        server = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    while (status := client.ask(path, "status")) is None:
        if server.poll() is not None or time.perf_counter() - t0 > _START_LIMIT_S:
            server.kill()
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            click.echo(
                f"bulkrun: error: the daemon did not start (log {log_path}): {' | '.join(tail)}", err=True
            )
            return EXIT_FATAL
        time.sleep(0.05)
    what = f"model {status['model']['path']} ({status['model']['dtype']})" if status["model"] else "no model"
    click.echo(
        f"bulkrun daemon: ready in {time.perf_counter() - t0:.1f} s (pid {status['pid']}, {what}); commands "
        f"from this environment start in it until it is idle {idle_minutes:g} min or `bulkrun daemon stop`"
    )
    return EXIT_OK


@daemon.command()
@click.option("--all", "every", is_flag=True, help="Stop this user's daemons of every environment.")
def stop(every: bool) -> int:
    """Stop this environment's daemon; the commands it is running finish first."""
    folder = _folder()
    paths = sorted(folder.glob("*.sock")) if every else [client.socket_path(folder)]
    stopped = 0
    for path in paths:
        answer = client.ask(path, "stop")
        if answer is not None:
            stopped += 1
            busy = f"; {answer['running']} running command(s) finish first" if answer["running"] else ""
            click.echo(f"bulkrun daemon: stopping pid {answer['pid']}{busy}")
    if not stopped:
        click.echo("bulkrun daemon: none running" + ("" if every else " for this environment"))
    return EXIT_OK


@daemon.command()
def status() -> int:
    """List this user's daemons: pid, model, commands served, and which one this environment uses."""
    folder = _folder()
    mine = client.socket_path(folder)
    found = 0
    for path in sorted(folder.glob("*.sock")):
        info = client.ask(path, "status", timeout=2.0)
        if info is None:
            _remove_if_dead(path)
            continue
        found += 1
        model = f"{info['model']['path']} ({info['model']['dtype']})" if info["model"] else "no model"
        click.echo(
            f"pid {info['pid']}: {model}; up {time.time() - info['started']:.0f} s, served {info['served']}, "
            f"running {info['running']}{' (this environment)' if path == mine else ''}"
        )
    if not found:
        click.echo("bulkrun daemon: none running")
    return EXIT_OK


def _remove_if_dead(path: Path) -> None:
    """A socket nothing listens on is what a killed daemon leaves (a live one listens before its
    socket gets its name): remove it."""
    sock = client.connect(path, timeout=2.0)
    if sock is not None:
        sock.close()
        return
    path.unlink(missing_ok=True)


def _folder() -> Path:
    folder = client.private_dir(create=True)
    if folder is None:
        raise UsageError(
            f"{client.daemon_dir()} is not private to this user; set {client.DIR_ENV} to a folder of your own"
        )
    return folder
