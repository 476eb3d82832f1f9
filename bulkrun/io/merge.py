"""Merge committed shards into one stream of records in input-row order, with bounded memory.

Every shard is sorted by row and records its row range. Shards are opened lazily: one joins the
merge heap only when the merge has reached its first row. Windows are read in input order, so at
any point only the few shards whose ranges overlap are open, whatever the number of shards.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from pathlib import Path

from bulkrun.io.shards import iter_shard_records, shard_paths, shard_row_range


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
