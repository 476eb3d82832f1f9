"""Hand a command to the resident `bulkrun daemon`, where one is up for this installation and environment.

A fresh `bulkrun` process spends over a second importing torch before it can load a model, which
is more than the whole of a small job. The daemon (daemon_server.py) has torch, the job layer and
the default model loaded; for each command it forks a child that runs the command exactly as this
process would, with this process's arguments, working directory, environment, umask and terminal
(stdin, stdout and stderr are passed over the socket). This process only waits: it forwards the
signals it gets (Ctrl-C, a cron timeout's SIGTERM) to the child and exits with the child's exit code.

Nothing here imports more than the standard library: the whole point is not to pay for imports.
A daemon is found by its socket's name, a hash of the Python executable, bulkrun's own code and the
environment variables read at import time; a changed installation or environment finds none and
runs in this process as before. BULKRUN_NO_DAEMON=1 always runs in this process.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

DIR_ENV = "BULKRUN_DAEMON_DIR"
OFF_ENV = "BULKRUN_NO_DAEMON"
# variables read while modules are imported or the model is loaded: a daemon started under other
# values would run a job differently than this process would, so they are part of its address
_KEYED_ENV_PREFIXES = (
    "BULKRUN_", "OMP_", "MKL_", "KMP_", "GOMP_", "ONEDNN_", "DNNL_", "TORCH", "PYTORCH_", "CUDA_",
    "NVIDIA_", "TRITON_", "LD_", "PYTHON", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "XDG_CACHE_HOME",
    "VIRTUAL_ENV",
)  # fmt: skip
_UNKEYED_ENV = {OFF_ENV}
PASSED_FDS = (0, 1, 2)  # stdin, stdout, stderr
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def daemon_dir() -> Path:
    """$BULKRUN_DAEMON_DIR, else $XDG_RUNTIME_DIR/bulkrun, else /tmp/bulkrun-<uid>."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "bulkrun"
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"bulkrun-{os.getuid()}"


def private_dir(create: bool = False) -> Path | None:
    """The daemons' folder, or None where it is missing or not this user's alone (never trusted then:
    whoever can write there could stand in for the daemon)."""
    folder = daemon_dir()
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = folder.stat()
    except OSError:
        return None
    return folder if st.st_uid == os.getuid() and not st.st_mode & 0o077 else None


def installation_key() -> str:
    """What a daemon must share with this process to run its commands the same way."""
    # the interpreter and environment, however they were named (python, python3, a symlink)
    digest = hashlib.sha256(f"{os.path.realpath(sys.executable)}\n{sys.prefix}\n".encode())
    for root in _code_roots():
        for folder, subfolders, files in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".py", ".so", ".cpp", ".h", ".jsonl")):
                    st = os.stat(os.path.join(folder, name))
                    digest.update(f"{folder}/{name}:{st.st_mtime_ns}:{st.st_size}\n".encode())
    for name in sorted(os.environ):
        if name.startswith(_KEYED_ENV_PREFIXES) and name not in _UNKEYED_ENV:
            digest.update(f"{name}={os.environ[name]}\n".encode())
    # the CPUs and control group this process may use: a job inside a Slurm allocation or a
    # container's limits must not run in a daemon started outside them
    digest.update(f"{sorted(os.sched_getaffinity(0))}\n".encode())
    try:
        with open("/proc/self/cgroup", "rb") as f:
            digest.update(f.read())
    except OSError:
        pass
    return digest.hexdigest()[:24]


def _code_roots() -> list[str]:
    import importlib.util

    roots = [str(Path(__file__).resolve().parents[1])]
    spec = importlib.util.find_spec("bulkrun_kernels")
    if spec is not None and spec.submodule_search_locations:
        roots.extend(spec.submodule_search_locations)
    return roots


def socket_path(folder: Path, key: str | None = None) -> Path:
    return folder / f"{key or installation_key()}.sock"


def connect(path: Path, timeout: float | None = None) -> socket.socket | None:
    """A connection to the daemon listening at path, or None where none answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except OSError:  # no daemon, or a socket file left by one that died
        sock.close()
        return None
    return sock


def ask(path: Path, command: str, timeout: float = 10.0) -> dict | None:
    """A control command's answer ({"cmd": "status"} or "stop"), None where no daemon answers."""
    sock = connect(path, timeout)
    if sock is None:
        return None
    with sock:
        try:
            sock.sendall(json.dumps({"cmd": command}).encode() + b"\n")
            return MessageReader(sock).next()
        except OSError:
            return None


class MessageReader:
    """JSON messages, one per line, off a stream socket."""

    def __init__(self, sock: socket.socket, data: bytes = b""):
        self.sock, self.data = sock, data

    def next(self) -> dict | None:
        """The next message; None once the other side has closed."""
        while b"\n" not in self.data:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.data += chunk
        line, self.data = self.data.split(b"\n", 1)
        return json.loads(line)


def run_in_daemon(argv: list[str]) -> int | None:
    """Run the command in this environment's daemon and return its exit code; None where no daemon
    took it (none is up, or it went away first): then the caller runs it itself."""
    if os.environ.get(OFF_ENV) or (argv and argv[0] == "daemon"):
        return None
    folder = private_dir()
    sock = None if folder is None else connect(socket_path(folder))
    if sock is None:
        return None
    with sock:
        try:  # (a working folder that is gone: the command runs here and says so itself)
            socket.send_fds(sock, [json.dumps(_job_header(argv)).encode() + b"\n"], _open_fds())
            messages = MessageReader(sock)
            started = messages.next()
        except OSError:
            return None
        if not started or "pid" not in started:  # it stopped before starting the job
            return None
        child = started["pid"]
        for signum in _FORWARDED_SIGNALS:
            signal.signal(signum, lambda signum, frame: _forward(child, signum))
        try:
            ended = messages.next()
        except OSError:
            ended = None
    if ended is None:
        print("bulkrun: error: the daemon went away before the command ended", file=sys.stderr)
        from bulkrun.exceptions import EXIT_FATAL

        return EXIT_FATAL
    return int(ended["exit"])


def _job_header(argv: list[str]) -> dict:
    umask = os.umask(0)
    os.umask(umask)
    return {"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask,
            "nice": os.getpriority(os.PRIO_PROCESS, 0)}  # fmt: skip


def _open_fds() -> list[int]:
    """stdin, stdout and stderr; /dev/null in place of one that is closed (cron may close stdin)."""
    fds = []
    for fd in PASSED_FDS:
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _forward(child: int, signum: int) -> None:
    try:
        os.kill(child, signum)
    except ProcessLookupError:  # it has just ended; its exit code is on its way
        pass
