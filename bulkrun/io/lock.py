"""One live run per output directory (per --shard slice or Ray worker), with stale-lock detection.

One lock for local and remote output directories. The lock is a file holding pid, hostname, the
process start time, a token and a heartbeat (refreshed at every checkpoint and at least every minute;
behind a URI by the upload thread every few seconds). A local lock file is created with O_EXCL; behind
a URI (s3://...) it is advisory: object stores have no exclusive create, so the holder is read first
and the file then written. Either way a lock is stale, and is taken over, when
- it was written on this host and its pid is gone, or now belongs to another process (start times
  differ: pids are reused), or
- it was written on another host and its heartbeat is older than STALE_AFTER_S (we cannot see
  that host's processes; a live run refreshes the heartbeat far more often).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import psutil

from bulkrun.errors import LockHeld
from bulkrun.io.atomic import writing
from bulkrun.io.outdir import OutDir

STALE_AFTER_S = 15 * 60


def _process_start(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _owner() -> dict:
    pid = os.getpid()
    return {"pid": pid, "hostname": socket.gethostname(), "started": _process_start(pid)}


def lock_name(writer: str) -> str:
    """The lock file of one writer: "lock" for a whole-job run, "lock.sKofN" for a slice."""
    return "lock" if writer == "part" else f"lock.{writer}"


class JobLock:
    """`JobLock(path)`: a local lock file; `JobLock(rel, outdir)`: the file `rel` behind a URI."""

    def __init__(self, path: Path | str, outdir: OutDir | None = None):
        self.path = path
        self.outdir = outdir
        self.held = False
        self.owner = _owner() | {"token": os.urandom(8).hex()}

    @property
    def where(self) -> str:
        return self.outdir.path(str(self.path)) if self.outdir is not None else str(self.path)

    def acquire(self) -> None:
        for _ in range(3):  # a stale lock removed by someone else between our tries: try again
            if self._try_create():
                self.held = True
                return
            holder = self.read()
            if holder is not None and is_live(holder):
                raise LockHeld(
                    f"the output directory is in use by pid {holder.get('pid')} on "
                    f"{holder.get('hostname')} (lock {self.where}); wait for it, or remove the lock "
                    "file if that run is surely dead"
                )
            self._remove()
        raise LockHeld(f"could not take the lock {self.where}")

    def _try_create(self) -> bool:
        record = json.dumps(self.owner | {"heartbeat": time.time()})
        if self.outdir is not None:
            if self.read() is not None:
                return False
            with writing(Path(self.where)):
                self.outdir.write_bytes(str(self.path), record.encode())
            return True
        with writing(self.path):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(record)
        return True

    def heartbeat(self) -> None:
        if not self.held:
            return
        with writing(Path(self.where)):
            if self.outdir is not None:
                self.outdir.write_bytes(
                    str(self.path), json.dumps(self.owner | {"heartbeat": time.time()}).encode()
                )
            else:
                os.utime(self.path)

    def release(self) -> None:
        if self.held:
            holder = self.read()
            if holder is not None and holder.get("token") == self.owner["token"]:
                self._remove()
            self.held = False

    def read(self) -> dict | None:
        if self.outdir is None:
            return read_lock(Path(self.path))
        try:
            data = self.outdir.read_bytes(str(self.path))
        except FileNotFoundError:
            return None
        except OSError:
            return None if not self.outdir.exists(str(self.path)) else {}
        return _holder(data.decode(errors="replace"), 0.0)

    def _remove(self) -> None:
        if self.outdir is None:
            Path(self.path).unlink(missing_ok=True)
        elif self.outdir.exists(str(self.path)):
            self.outdir.delete(str(self.path))

    def __enter__(self) -> JobLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def read_lock(path: Path) -> dict | None:
    """The holder recorded in a lock file; {} for an unreadable one, None when there is none."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return _holder(text, mtime)


def _holder(text: str, mtime: float) -> dict:
    try:
        holder = json.loads(text)
    except ValueError:
        holder = {}  # killed between create and write: stale unless very fresh
    if not isinstance(holder, dict):
        holder = {}
    holder["heartbeat"] = max(float(holder.get("heartbeat", 0)), mtime)
    return holder


def is_live(holder: dict) -> bool:
    age = time.time() - holder.get("heartbeat", 0)
    if "pid" not in holder:
        return age < 5
    if holder.get("hostname") != socket.gethostname():
        return age < STALE_AFTER_S
    started = _process_start(holder["pid"])
    if started is None:
        return False
    return holder.get("started") is None or abs(started - holder["started"]) < 1.0
