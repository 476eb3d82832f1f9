"""The resident `bulkrun daemon`: torch, the job layer and a model loaded once, a forked child per command.

Start-up of a fresh process is mostly `import torch` (over a second on a 2-core box) and the model
load; a child forked from a process that has done both starts its first engine step in a fraction
of a second and shares the weights' pages with the daemon. Each child is a whole `bulkrun` run of
its own: its client's arguments, working directory, environment, umask and stdin/stdout/stderr
(daemon_client.py), so a job behaves as it would in the client's own process, and one that crashes
takes nothing else with it.

The daemon stays single-threaded, and runs torch on one thread while it loads, so that a fork finds
no thread pool (OpenMP's cannot survive a fork); each child sets the thread count the client's
process would have. Its loop waits on the listening socket, each running job's client connection
(a client that goes away has its job stopped as Ctrl-C would stop it, committed work kept) and each
child's pidfd (its exit code goes back to the client). It ends after --idle-timeout seconds without
a job, on `bulkrun daemon stop` or on SIGTERM, letting running jobs finish first.

    python -m bulkrun.cli.daemon_server --socket PATH [--model REF] [--idle-timeout S]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path

from bulkrun.cli.daemon_client import PASSED_FDS, MessageReader
from bulkrun.exceptions import EXIT_FATAL

_HEADER_LIMIT = 1 << 22


class _Job:
    def __init__(self, pid: int, conn: socket.socket):
        self.pid, self.conn = pid, conn
        self.pidfd = os.pidfd_open(pid)
        self.client_gone = False


class Daemon:
    def __init__(self, path: Path, idle_timeout: float):
        self.path, self.idle_timeout = path, idle_timeout
        self.started = time.time()
        self.last_active = time.monotonic()
        self.served = 0
        self.jobs: dict[int, _Job] = {}  # by pidfd
        self.listener: socket.socket | None = None
        # SIGTERM / SIGINT write a byte here (signal.set_wakeup_fd): the loop stops between jobs,
        # never inside a handler that would close the listener under a running select()
        self.signals, self._signals_in = socket.socketpair()
        self.threads = 1  # the thread count a fresh `bulkrun` process would run torch with
        self.resident: dict | None = None

    # -- start-up --------------------------------------------------------------------------------
    def preload(self, model_ref: str | None, load_model: bool) -> None:
        import torch

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)  # no OpenMP pool before a fork (see the module docstring)
        import pyarrow as pa

        import bulkrun.cli  # noqa: F401  (every command and the job layer they import)
        import bulkrun.engine.core.engine  # noqa: F401
        import bulkrun.engine.worker.runner  # noqa: F401
        import bulkrun.job.runner  # noqa: F401

        pa.array([0])  # pyarrow imports pandas on its first array: once here, not in every job
        if load_model:
            self.resident = _keep_model_resident(model_ref)
        gc.collect()
        gc.freeze()  # the children's collections leave the daemon's objects (and their pages) alone

    def listen(self) -> None:
        """Listen under a temporary name, then rename: a client never connects to a daemon that is
        still loading, and two daemons starting at once end with one answering."""
        starting = self.path.with_name(f"{self.path.name}.{os.getpid()}.starting")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(starting))
        self.listener.listen(64)
        os.replace(starting, self.path)
        self.inode = os.stat(self.path).st_ino
        self.last_active = time.monotonic()  # idle from now, not from the start of the load
        _log(f"ready at {self.path} (pid {os.getpid()})")

    @property
    def stopping(self) -> bool:
        return self.listener is None

    # -- the loop --------------------------------------------------------------------------------
    def serve(self) -> None:
        self._signals_in.setblocking(False)
        signal.set_wakeup_fd(self._signals_in.fileno())
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: None)  # handled: the wakeup byte does the rest
        while not (self.stopping and not self.jobs):
            waiting = [self.signals, *self.jobs, *(j.conn for j in self.jobs.values() if not j.client_gone)]
            if self.listener is not None:
                waiting.append(self.listener)
            timeout = None
            if not self.jobs and not self.stopping:
                timeout = max(0.0, self.last_active + self.idle_timeout - time.monotonic())
            ready, _, _ = select.select(waiting, [], [], timeout)
            if not ready and not self.jobs and not self.stopping:
                _log(f"idle for {self.idle_timeout:.0f} s: stopping")
                self.stop()
            for item in ready:
                if item is self.signals:
                    self.signals.recv(64)
                    _log("asked to stop")
                    self.stop()
                elif item is self.listener:
                    self._accept()
                elif isinstance(item, int):
                    self._reap(self.jobs.pop(item))
                else:
                    self._client_spoke(item)
        _log("stopped")

    def stop(self) -> None:
        """Take no more jobs (new commands run in their own process); the running ones finish."""
        if self.listener is None:
            return
        try:
            if os.stat(self.path).st_ino == self.inode:  # still ours, not a newer daemon's
                os.unlink(self.path)
        except OSError:
            pass
        self.listener.close()
        self.listener = None

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError as exc:  # e.g. out of file descriptors: the client runs the command itself
            _log(f"could not accept a command: {exc}")
            return
        conn.settimeout(10.0)  # a client sends its whole request at once
        try:
            if _peer_uid(conn) != os.getuid():
                raise PermissionError("a client of another user")
            data, fds, _, _ = socket.recv_fds(conn, 65536, len(PASSED_FDS))
            reader = MessageReader(conn, data)
            request = reader.next() if len(data) < _HEADER_LIMIT else None
        except (OSError, ValueError) as exc:
            _log(f"dropped a request: {exc}")
            conn.close()
            return
        if request is None or "cmd" in request:
            self._control(conn, request)
            return
        if self.stopping or len(fds) != len(PASSED_FDS):
            conn.close()  # the client runs the command itself
            for fd in fds:
                os.close(fd)
            return
        self._fork(conn, request, fds)

    def _control(self, conn: socket.socket, request: dict | None) -> None:
        command = (request or {}).get("cmd")
        if command == "stop":
            self.stop()
        answer = {
            "pid": os.getpid(), "started": self.started, "served": self.served, "running": len(self.jobs),
            "model": self.resident, "idle_timeout": self.idle_timeout, "stopping": self.stopping,
        }  # fmt: skip
        try:
            conn.sendall(json.dumps(answer).encode() + b"\n")
        except OSError:
            pass
        conn.close()

    def _fork(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        try:
            pid = os.fork()
        except OSError as exc:  # no process to spare: the client, told nothing, runs the command itself
            _log(f"could not fork: {exc}")
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        if pid == 0:
            code = EXIT_FATAL  # should the job's own handling fail
            try:
                code = _run_child(request, fds, self.threads, [conn, *self._open_handles()])
            except BaseException:  # noqa: BLE001 - the child must end here, never return to the loop
                traceback.print_exc()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        self.served += 1
        self.last_active = time.monotonic()
        job = _Job(pid, conn)
        self.jobs[job.pidfd] = job
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the client is gone already: stop the job as its Ctrl-C would
            self._client_gone(job)

    def _open_handles(self) -> list:
        """The daemon's sockets and the other jobs' connections and pidfds, which a new child closes."""
        jobs = [handle for job in self.jobs.values() for handle in (job.conn, job.pidfd)]
        return [self.listener, self.signals, self._signals_in, *jobs]

    def _reap(self, job: _Job) -> None:
        _, status = os.waitpid(job.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
        os.close(job.pidfd)
        if not job.client_gone:
            try:
                job.conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
            except OSError:
                pass
        job.conn.close()
        self.last_active = time.monotonic()

    def _client_spoke(self, conn: socket.socket) -> None:
        job = next(j for j in self.jobs.values() if j.conn is conn)
        try:
            gone = not conn.recv(4096)
        except OSError:
            gone = True
        if gone:
            self._client_gone(job)

    def _client_gone(self, job: _Job) -> None:
        job.client_gone = True
        try:
            os.kill(job.pid, signal.SIGTERM)  # commits what is finished, then stops
        except ProcessLookupError:
            pass


def _run_child(request: dict, fds: list[int], threads: int, inherited: list) -> int:
    """Become the client's `bulkrun` process and run its command; returns the exit code."""
    for handle in inherited:
        if isinstance(handle, int):
            os.close(handle)
        elif handle is not None:
            handle.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.setpgid(0, 0)  # its own process group: a signal to the daemon's group does not reach it
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    if request["nice"] > os.getpriority(os.PRIO_PROCESS, 0):  # `nice bulkrun ...` stays nice
        os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdin = os.fdopen(0, "r", closefd=False)
    sys.stdout = os.fdopen(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, errors="backslashreplace", closefd=False)
    sys.argv = ["bulkrun", *request["argv"]]
    import torch

    torch.set_num_threads(threads)
    from bulkrun.cli import main

    code = main(list(request["argv"]))
    if "ray" in sys.modules:  # Ray's shutdown lives in its atexit handler
        import atexit

        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _keep_model_resident(model_ref: str | None) -> dict | None:
    """The model the jobs of this environment default to, loaded as their engines would load it."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # asking must not initialize CUDA
    import torch

    if torch.cuda.is_available():  # a CUDA context cannot cross a fork: the children load their own
        _log("a GPU is present: the model is loaded by each job, not kept here")
        return None
    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.worker.loaded_model import keep_resident
    from bulkrun.model_source import resolve_model

    path = str(resolve_model(model_ref))
    loaded = keep_resident(path, EngineConfig())
    loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    return {"path": path, "dtype": str(loaded.dtype).removeprefix("torch.")}


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} bulkrun daemon: {message}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True, type=Path)
    ap.add_argument("--model", default=None, help="the model to keep loaded (default: the default model)")
    ap.add_argument("--no-model", action="store_true", help="keep only the imports, no model")
    ap.add_argument("--idle-timeout", type=float, default=1800.0)
    args = ap.parse_args()
    daemon = Daemon(args.socket, args.idle_timeout)
    t0 = time.perf_counter()
    daemon.preload(args.model, not args.no_model)
    _log(f"loaded in {time.perf_counter() - t0:.2f} s; model: {daemon.resident}")
    daemon.listen()
    daemon.serve()


if __name__ == "__main__":
    main()
