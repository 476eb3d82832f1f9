"""Result and error shards: the job's only source of truth.

A shard is a Parquet file `<dir>/<prefix>-NNNNN.parquet` holding finished records sorted by input
row, committed atomically. Whatever is committed is done; whatever is not is redone on the next run,
so a kill -9 at any instant loses at most the records since the last commit and never duplicates one.
Each shard stores its row range in the file metadata so a merge can open shards lazily: the merge
into input order opens a shard only when it reaches the shard's first row, so only the few shards
whose ranges overlap are open at once, whatever the number of shards.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bulkrun.io.atomic import make_dirs, remove_temporaries, write_atomic

RESULTS_DIR = "shards"
ERRORS_DIR = "errors"
ERROR_COLUMNS = ("row", "id", "kind", "message")
META_MIN, META_MAX = b"bulkrun.min_row", b"bulkrun.max_row"
_NAME = re.compile(r"^(?P<prefix>.+)-(?P<num>\d{5,})\.parquet$")


class ShardWriter:
    """Buffers finished records and commits them as one shard per checkpoint."""

    def __init__(self, directory: Path, prefix: str = "part"):
        self.directory = directory
        self.prefix = prefix
        make_dirs(directory)
        remove_temporaries(directory, prefix)
        self._next = 1 + max((n for p, n in _numbered(directory) if p == prefix), default=-1)
        self._buffer: list[dict] = []

    def add(self, record: dict) -> None:
        self._buffer.append(record)

    def __len__(self) -> int:
        return len(self._buffer)

    def commit(self) -> Path | None:
        """Write the buffered records as the next shard; None when there was nothing to write."""
        if not self._buffer:
            return None
        records = sorted(self._buffer, key=lambda r: r["row"])
        table = records_table(records)
        meta = {META_MIN: str(records[0]["row"]).encode(), META_MAX: str(records[-1]["row"]).encode()}
        table = table.replace_schema_metadata(meta)
        path = self.directory / f"{self.prefix}-{self._next:05d}.parquet"
        write_atomic(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
        self._next += 1
        self._buffer.clear()
        return path


def records_table(records: list[dict]) -> pa.Table:
    """A table of records whose keys may differ (the union of keys, in first-seen order). A column of
    numpy vectors (embeddings) becomes fixed_size_list<dtype>[dim], what vector stores load."""
    names = list(dict.fromkeys(key for record in records for key in record))
    return pa.table({name: _column([r.get(name) for r in records]) for name in names})


def _column(values: list) -> pa.Array:
    first = next((v for v in values if v is not None), None)
    if not isinstance(first, np.ndarray) or first.ndim != 1:
        return pa.array(values)
    dim = first.shape[0]
    if any(v is None or v.shape != first.shape for v in values):
        return pa.array([None if v is None else v.tolist() for v in values])  # ragged: plain lists
    flat = np.concatenate(values) if values else np.empty(0, first.dtype)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), dim)


def _numbered(directory: Path) -> Iterator[tuple[str, int]]:
    for path in directory.glob("*.parquet"):
        match = _NAME.match(path.name)
        if match:
            yield match["prefix"], int(match["num"])


def shard_paths(directory: Path) -> list[Path]:
    """Committed shards of a directory (every prefix), in name order."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.parquet") if _NAME.match(p.name))


def shard_row_range(path: Path) -> tuple[int, int, int]:
    """(min row, max row, number of records) from the file metadata, without reading data."""
    meta = pq.read_metadata(path)
    kv = meta.metadata or {}
    return int(kv[META_MIN]), int(kv[META_MAX]), meta.num_rows


def shard_rows(path: Path) -> list[int]:
    return pq.read_table(path, columns=["row"]).column("row").to_pylist()


def iter_shard_records(path: Path, batch_rows: int = 256) -> Iterator[dict]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
        yield from batch.to_pylist()


def merged_records(directory: Path, stats: dict | None = None) -> Iterator[dict]:
    """Records of all shards in `directory`, ordered by row; a row committed twice is kept once."""
    pending = sorted((shard_row_range(p)[0], str(p)) for p in shard_paths(directory))
    pending.reverse()  # pop() from the end gives the shard with the smallest first row
    heap: list[tuple[int, int, dict, Iterator[dict]]] = []
    serial = 0  # tie-breaker: never compare dicts
    last_row = None

    def open_next() -> None:
        nonlocal serial
        _, path = pending.pop()
        records = iter_shard_records(Path(path))
        first = next(records, None)
        if first is not None:
            heapq.heappush(heap, (first["row"], serial, first, records))
            serial += 1

    while heap or pending:
        while pending and (not heap or pending[-1][0] <= heap[0][0]):
            open_next()
        if not heap:
            continue
        row, _, record, records = heapq.heappop(heap)
        nxt = next(records, None)
        if nxt is not None:
            heapq.heappush(heap, (nxt["row"], serial, nxt, records))
            serial += 1
        if row == last_row:
            if stats is not None:
                stats["duplicates"] = stats.get("duplicates", 0) + 1
            continue
        last_row = row
        yield record
