"""Crash-safe file writes: a file either has its old content or its complete new content.

Write to a temporary file beside the target, fsync it, rename it over the target (atomic on POSIX),
then fsync the directory so the rename itself survives a power cut. A kill -9 at any point leaves at
most a `.tmp-*` file behind, which `remove_temporaries` cleans up on the next run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bulkrun.errors import OutputError

TMP_PREFIX = ".tmp-"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tmp_path(target: Path) -> Path:
    return target.with_name(f"{TMP_PREFIX}{target.name}.{os.getpid()}")


@contextmanager
def writing(target: Path) -> Iterator[None]:
    """Any OSError while writing `target` (a full disk, a read-only or vanished directory, a quota)
    becomes OutputError (exit code 9): one line naming the path and the reason, no traceback."""
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise OutputError(f"cannot write '{target}': {reason}") from None


def write_atomic(target: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path) to produce the file, then commit it as `target` atomically."""
    tmp = _tmp_path(target)
    with writing(target):
        try:
            write(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(target.parent)


def make_dirs(directory: Path) -> None:
    with writing(directory):
        directory.mkdir(parents=True, exist_ok=True)


def write_text_atomic(target: Path, text: str) -> None:
    write_atomic(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(target: Path, data: dict) -> None:
    write_text_atomic(target, json.dumps(data, indent=2, sort_keys=False) + "\n")


def create_exclusive(target: Path, text: str) -> bool:
    """Create `target` with `text` only if it does not exist yet (atomically); False if it existed."""
    tmp = _tmp_path(target)
    with writing(target):
        try:
            tmp.write_text(text, encoding="utf-8")
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(tmp, target)  # fails if target exists: no window where a half file is visible
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(target.parent)
    return True


def remove_temporaries(directory: Path, name_prefix: str = "") -> None:
    """Delete leftovers of writes that a killed run never committed. Only names starting with
    `name_prefix` are touched, so parallel --shard slices never delete each other's live files."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if path.name.startswith(TMP_PREFIX + name_prefix):
            path.unlink(missing_ok=True)
