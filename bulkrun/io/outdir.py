"""One output directory that may be local, shared (NFS) or remote (any URI pyarrow's filesystems take).

Local paths use plain os calls (temporary file, fsync, rename: a reader never sees half a file).
URIs (s3://, gs://, hdfs://, file://) go through `pyarrow.fs.FileSystem.from_uri`; object stores make a
PUT visible all at once, and for the others we still write a temporary name and move it.
For s3:// that takes the standard AWS environment: credentials (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, instance roles), AWS_DEFAULT_REGION, and the
endpoint of an S3-compatible store (MinIO, Ceph, ...) from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL
(tests/distributed/test_dist_s3.py runs jobs against a local S3 server that way).
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass, field
from typing import Any


def is_uri(out: str) -> bool:
    return "://" in str(out)


@dataclass
class OutDir:
    """Small file API over one output directory; `rel` paths are '/'-separated, relative to it."""

    out: str
    _fs: Any = field(default=None, init=False, repr=False)
    _root: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        self.out = str(self.out)
        if is_uri(self.out):
            from pyarrow import fs as pafs

            self._fs, self._root = pafs.FileSystem.from_uri(self.out)
            self._root = self._root.rstrip("/")
        else:
            self._root = os.path.abspath(self.out)

    @property
    def remote(self) -> bool:
        return self._fs is not None

    def path(self, rel: str) -> str:
        """The absolute path of `rel` (a filesystem path; for URIs, inside that filesystem)."""
        if self.remote:
            return posixpath.join(self._root, rel) if rel else self._root
        return os.path.join(self._root, *rel.split("/")) if rel else self._root

    def filesystem(self) -> Any:
        """A pyarrow filesystem for readers/writers that take one (local paths too)."""
        if self.remote:
            return self._fs
        from pyarrow import fs as pafs

        return pafs.LocalFileSystem()

    def makedirs(self, rel: str) -> None:
        if self.remote:
            self._fs.create_dir(self.path(rel), recursive=True)
        else:
            os.makedirs(self.path(rel), exist_ok=True)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write `rel` atomically: a reader sees the old file, the new one, or none, never half."""
        parent = posixpath.dirname(rel)
        self.makedirs(parent)
        tmp_rel = posixpath.join(parent, f".tmp-{uuid.uuid4().hex}-{posixpath.basename(rel)}")
        if self.remote:
            with self._fs.open_output_stream(self.path(tmp_rel)) as stream:
                stream.write(data)
            self._fs.move(self.path(tmp_rel), self.path(rel))
            return
        tmp = self.path(tmp_rel)
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path(rel))
        _fsync_dir(os.path.dirname(self.path(rel)))

    def read_bytes(self, rel: str) -> bytes:
        if self.remote:
            with self._fs.open_input_stream(self.path(rel)) as stream:
                return stream.read()
        with open(self.path(rel), "rb") as handle:
            return handle.read()

    def exists(self, rel: str) -> bool:
        if self.remote:
            from pyarrow import fs as pafs

            return self._fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound
        return os.path.exists(self.path(rel))

    def listdir(self, rel: str) -> list[str]:
        """File names (not paths) directly inside `rel`, sorted; [] when it does not exist."""
        if self.remote:
            from pyarrow import fs as pafs

            selector = pafs.FileSelector(self.path(rel), allow_not_found=True)
            for attempt in range(3):
                try:
                    infos = self._fs.get_file_info(selector)
                    break
                except FileNotFoundError:
                    # seen on a file:// output under load while another worker created the folder:
                    # the listing raced its creation. Absent is "does not exist"; present, look again
                    # (never [] for a folder that exists: its shards would be redone)
                    if not self.exists(rel):
                        return []
                    if attempt == 2:
                        raise
            return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)
        try:
            names = os.listdir(self.path(rel))
        except FileNotFoundError:
            return []
        return sorted(n for n in names if os.path.isfile(os.path.join(self.path(rel), n)))

    def delete(self, rel: str) -> None:
        if self.remote:
            self._fs.delete_file(self.path(rel))
        else:
            os.remove(self.path(rel))


def _fsync_dir(path: str) -> None:
    # The rename itself must survive a crash too: sync the directory entry where the OS allows it.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
