"""Output directories behind a URI (s3://, gs://, hdfs://, file://): a local mirror kept in sync.

The job layer reads and writes a local directory (atomic renames, O_EXCL locks). For a URI, each
process works in a private local staging directory instead:
- before it starts, it pulls what the job already holds there (manifest, committed shards, slice
  markers), so resume works exactly as on a local directory;
- while it runs, a background thread uploads every newly committed shard (a shard appears locally
  only once complete, and an upload is made visible all at once), so what is uploaded is committed;
- at the end it uploads the rest (and, for the process that finalizes, the final files).
A process killed mid-run loses only what it had not uploaded yet; the next run redoes exactly that.
The lock behind a URI is io/lock.py's JobLock (advisory there), refreshed by the upload thread.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bulkrun.io.lock import JobLock, lock_name
from bulkrun.io.outdir import OutDir, is_uri

PULL_DIRS = ("shards", "errors", "slices")
PUSH_DIRS = ("shards", "errors", "slices", "progress")
MANIFEST = "manifest.json"
UPLOAD_EVERY_S = 5.0


class RemoteMirror:
    """A local directory mirroring one remote output directory."""

    def __init__(self, uri: str, local: Path):
        self.uri = uri
        self.remote = OutDir(uri)
        self.local = local
        # relative path -> local mtime of the version the remote has (pulled or pushed); a file
        # rewritten since (progress, a slice marker) is uploaded again.
        self._known: dict[str, int] = {}
        self._lock = threading.Lock()

    def pull(self, dirs: tuple[str, ...] = PULL_DIRS) -> int:
        """Download the remote's manifest and the files of `dirs` that are not here yet."""
        count = self._download_if_missing(MANIFEST)
        for sub in dirs:
            for name in self.remote.listdir(sub):
                if not name.startswith(".tmp-"):
                    count += self._download_if_missing(f"{sub}/{name}")
        return count

    def push(self, dirs: tuple[str, ...] = PUSH_DIRS, files: tuple[str, ...] = (MANIFEST,)) -> int:
        """Upload the local files of `dirs` (and `files`) the remote does not have yet."""
        with self._lock:  # the upload thread and the final push never upload the same file twice
            count = 0
            candidates = list(files)
            for sub in dirs:
                folder = self.local / sub
                names = sorted(os.listdir(folder)) if folder.is_dir() else []
                candidates += [f"{sub}/{name}" for name in names if not name.startswith(".tmp-")]
            for rel in candidates:
                mtime = _mtime(self.local / rel)
                if mtime is not None and self._known.get(rel) != mtime:
                    count += self._upload(rel)
            return count

    def push_files(self, names: list[str]) -> None:
        """Upload (and overwrite) files that change, such as the final results and report.json."""
        with self._lock:
            for rel in names:
                if (self.local / rel).is_file():
                    self._upload(rel)

    def wipe_remote(self, names: tuple[str, ...], dirs: tuple[str, ...]) -> None:
        """--restart: remove a previous job's files from the remote (never our own lock)."""
        for rel in names:
            if self.remote.exists(rel):
                self.remote.delete(rel)
        for sub in dirs:
            for name in self.remote.listdir(sub):
                self.remote.delete(f"{sub}/{name}")

    def _download_if_missing(self, rel: str) -> int:
        target = self.local / rel
        if target.exists() or not self.remote.exists(rel):
            return 0
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".tmp-pull-{target.name}")
        from pyarrow import fs as pafs

        pafs.copy_files(self.remote.path(rel), str(tmp), source_filesystem=self.remote.filesystem(),
                        destination_filesystem=pafs.LocalFileSystem())  # fmt: skip
        os.replace(tmp, target)  # the job layer only ever sees complete files
        self._known[rel] = _mtime(target)
        return 1

    def _upload(self, rel: str) -> int:
        from pyarrow import fs as pafs

        fs = self.remote.filesystem()
        self.remote.makedirs(os.path.dirname(rel))
        final = self.remote.path(rel)
        # Object stores publish an upload all at once; other filesystems get a temporary name first.
        direct = getattr(fs, "type_name", "") in ("s3", "gcs")
        target = (
            final if direct else self.remote.path(f"{os.path.dirname(rel)}/.tmp-push-{os.path.basename(rel)}")
        )
        mtime = _mtime(self.local / rel)
        pafs.copy_files(str(self.local / rel), target, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs)  # fmt: skip
        if not direct:
            fs.move(target, final)
        self._known[rel] = mtime
        return 1


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns if path.is_file() else None
    except OSError:
        return None


class _Uploader(threading.Thread):
    def __init__(self, mirror: RemoteMirror, lock: JobLock | None, every_s: float):
        super().__init__(name="bulkrun-uploader", daemon=True)
        self.mirror, self.lock, self.every_s = mirror, lock, every_s
        self.stopped = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            try:
                self.mirror.push()
                if self.lock is not None:
                    self.lock.heartbeat()
            except Exception as exc:  # a network hiccup: the next round or the final push retries
                self.error = exc


@contextmanager
def staged(uri: str, *, writer: str, lock: bool, wipe: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
           every_s: float = UPLOAD_EVERY_S) -> Iterator[RemoteMirror]:  # fmt: skip
    """A private local mirror of `uri` for one process; uploads as it goes and at the end."""
    local = Path(tempfile.mkdtemp(prefix="bulkrun-stage-"))
    mirror = RemoteMirror(uri, local)
    remote_lock = JobLock(lock_name(writer), mirror.remote) if lock else None
    try:
        if remote_lock is not None:
            remote_lock.acquire()
        if wipe is not None:
            mirror.wipe_remote(*wipe)
        mirror.pull()
        uploader = _Uploader(mirror, remote_lock, every_s)
        uploader.start()
        try:
            yield mirror
        finally:
            uploader.stopped.set()
            uploader.join()
            mirror.push()  # whatever was committed locally, including after an interruption
    finally:
        if remote_lock is not None:
            remote_lock.release()
        shutil.rmtree(local, ignore_errors=True)


def uri_out(spec) -> str | None:
    """The spec's output URI, or None for a local directory."""
    out = getattr(spec, "out", None)
    return str(out) if out and is_uri(str(out)) else None
