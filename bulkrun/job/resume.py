"""What is already done: read back from the committed shards (the only truth, see io/shards.py).

Rows are kept in a bitmap (one bit per input row), so a million-row job costs 125 KB here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from bulkrun.io.shards import ERRORS_DIR, RESULTS_DIR, shard_paths, shard_rows


class RowSet:
    """A growable bitmap of row indices."""

    __slots__ = ("_bits", "count")

    def __init__(self) -> None:
        self._bits = bytearray()
        self.count = 0

    def add(self, row: int) -> bool:
        """Mark `row`; False if it was already marked."""
        byte, bit = divmod(row, 8)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits) // 2)))
        if self._bits[byte] >> bit & 1:
            return False
        self._bits[byte] |= 1 << bit
        self.count += 1
        return True

    def __contains__(self, row: int) -> bool:
        byte, bit = divmod(row, 8)
        return byte < len(self._bits) and bool(self._bits[byte] >> bit & 1)

    def __len__(self) -> int:
        return self.count

    def rows(self):
        """The marked rows, ascending."""
        for byte_index, byte in enumerate(self._bits):
            if byte:
                base = byte_index * 8
                for bit in range(8):
                    if byte >> bit & 1:
                        yield base + bit


@dataclass
class Committed:
    done: RowSet = field(default_factory=RowSet)  # rows with a result or an error record
    error_rows: RowSet = field(default_factory=RowSet)  # rows with an error record
    results: int = 0
    errors: int = 0
    duplicates: int = 0  # rows committed twice (should never happen; merge keeps the first)


def load_committed(out: Path) -> Committed:
    """Scan every committed shard (results and errors, all writers' prefixes)."""
    state = Committed()
    for sub, attr in ((RESULTS_DIR, "results"), (ERRORS_DIR, "errors")):
        for path in shard_paths(out / sub):
            try:
                rows = shard_rows(path)
            except Exception as exc:  # an unreadable shard is set aside and its rows redone
                _set_aside(path, exc)
                continue
            for row in rows:
                if state.done.add(row):
                    setattr(state, attr, getattr(state, attr) + 1)
                    if sub == ERRORS_DIR:
                        state.error_rows.add(row)
                else:
                    state.duplicates += 1
    return state


def _set_aside(path: Path, exc: Exception) -> None:
    bad = path.with_suffix(".parquet.unreadable")
    path.rename(bad)
    print(f"bulkrun: warning: shard {path.name} unreadable ({exc}); moved to {bad.name}", file=sys.stderr)
