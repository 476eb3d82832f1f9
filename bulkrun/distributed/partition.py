"""Deterministic item partitioning: which input rows one process (a job-array task or a Ray worker) owns.

A row belongs to slice `row % count`. Striding by row index needs no knowledge of the input's length,
gives every slice a similar mix of short and long rows, and never changes as the input is read as a
stream. Slices are 0-based, as Kubernetes' JOB_COMPLETION_INDEX and `sbatch --array=0-(N-1)` are.
Plain Python: importing this module costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from bulkrun.errors import UsageError

T = TypeVar("T")

_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_TAG_RE = re.compile(r"^s(\d+)of(\d+)$")


class ShardError(UsageError, ValueError):
    """A bad `--shard` value (exit code 2, one line, no traceback)."""


@dataclass(frozen=True, slots=True)
class Partition:
    """Slice `index` of `count` (0-based): the rows whose index modulo `count` equals `index`."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ShardError(f"shard count must be at least 1, got {self.count}")
        if not 0 <= self.index < self.count:
            raise ShardError(
                f"shard index must be in 0..{self.count - 1} (0-based) for {self.count} shards, got {self.index}"
            )

    def owns(self, row: int) -> bool:
        return row % self.count == self.index

    def select(self, rows: Iterable[T]) -> Iterator[T]:
        """The owned elements of a stream, where an element's position is its row index."""
        return (item for row, item in enumerate(rows) if row % self.count == self.index)

    @property
    def tag(self) -> str:
        """A file-name-safe label: slice 2 of 8 -> "s2of8"."""
        return f"s{self.index}of{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def from_tag(cls, tag: str) -> Partition:
        match = _TAG_RE.match(tag)
        if match is None:
            raise ValueError(f"not a slice tag: {tag!r} (expected like 's2of8')")
        return cls(int(match.group(1)), int(match.group(2)))


def parse_shard(text: str | Partition | tuple[int, int]) -> Partition:
    """Parse `--shard K/N` (0-based K); a bad value raises ShardError with a one-line message."""
    if isinstance(text, Partition):
        return text
    if isinstance(text, tuple):
        return Partition(*text)
    match = _SHARD_RE.match(str(text))
    if match is None:
        raise ShardError(f"--shard expects K/N with 0 <= K < N (0-based, e.g. 0/4 .. 3/4), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1:
        raise ShardError(f"--shard {text}: N must be at least 1")
    if index >= count:
        raise ShardError(
            f"--shard {text}: K is 0-based and must be below N (use {count - 1}/{count} for the last slice)"
        )
    return Partition(index, count)


def all_partitions(count: int) -> list[Partition]:
    """Every slice of a `count`-way split: together they own each row exactly once."""
    return [Partition(index, count) for index in range(count)]
