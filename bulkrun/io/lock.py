"""One live run per output directory (per --shard slice), with stale-lock detection.

The lock is a file created with O_EXCL holding pid, hostname, the process start time and a
heartbeat (refreshed at every checkpoint and at least every minute). A lock is stale, and is
taken over, when
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

STALE_AFTER_S = 15 * 60


def _process_start(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _owner() -> dict:
    pid = os.getpid()
    return {"pid": pid, "hostname": socket.gethostname(), "started": _process_start(pid)}


class JobLock:
    def __init__(self, path: Path):
        self.path = path
        self.held = False

    def acquire(self) -> None:
        for _ in range(3):  # a stale lock removed by someone else between our tries: try again
            if self._try_create():
                self.held = True
                return
            holder = read_lock(self.path)
            if holder is not None and is_live(holder):
                raise LockHeld(
                    f"'{self.path.parent}' is in use by pid {holder.get('pid')} on "
                    f"{holder.get('hostname')} (lock {self.path}); wait for it, or remove the lock "
                    "file if that run is surely dead"
                )
            self.path.unlink(missing_ok=True)
        raise LockHeld(f"could not take the lock {self.path}")

    def _try_create(self) -> bool:
        owner = _owner() | {"heartbeat": time.time()}
        with writing(self.path):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                json.dump(owner, f)
        return True

    def heartbeat(self) -> None:
        if self.held:
            with writing(self.path):
                os.utime(self.path)

    def release(self) -> None:
        if self.held:
            holder = read_lock(self.path)
            if holder is not None and holder.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False

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
    try:
        holder = json.loads(text)
    except ValueError:
        holder = {}  # killed between create and write: stale unless very fresh
    holder["heartbeat"] = max(holder.get("heartbeat", 0), mtime)
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
