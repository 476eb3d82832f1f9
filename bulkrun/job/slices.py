"""Slices of a job: which rows one process owns (`--shard K/N`, a Ray worker), and the markers that
say a slice is done.

A row belongs to slice `row % count`. Striding by row index needs no knowledge of the input's length,
gives every slice a similar mix of short and long rows, and never changes as the input is read as a
stream. Slices are 0-based, as Kubernetes' JOB_COMPLETION_INDEX and `sbatch --array=0-(N-1)` are.

A slice run that read its whole slice writes OUT/slices/s{K}of{N}.json holding its run statistics.
The job is complete when, for some N, all N slices are done (a rerun may use another N: resume goes
by committed ids, so any full split covers every row).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from bulkrun.errors import Incomplete, UsageError
from bulkrun.io.outdir import OutDir

SLICES_DIR = "slices"

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


class IncompleteSlices(Incomplete):
    """Raised by check_complete: some slices have not finished (the message lists them)."""

    def __init__(self, missing: Mapping[int, list[int]]):
        self.missing = {count: sorted(idx) for count, idx in missing.items()}
        parts = []
        for count, indexes in sorted(self.missing.items()):
            listed = ", ".join(f"{i}/{count}" for i in indexes)
            parts.append(f"{len(indexes)} of {count} slices not done: {listed}")
        super().__init__(
            "the job is incomplete: " + "; ".join(parts) + " (run them with --shard K/N, then export again)"
        )


def _marker_name(partition: Partition) -> str:
    return f"{SLICES_DIR}/{partition.tag}.json"


def mark_slice_done(
    out: str | OutDir, partition: Partition, stats: dict, fingerprint: str | None = None
) -> None:
    """Record that `partition` has read its whole slice and committed every one of its rows."""
    outdir = out if isinstance(out, OutDir) else OutDir(str(out))
    payload = {
        "index": partition.index,
        "count": partition.count,
        "fingerprint": fingerprint,
        "finished_at": time.time(),
        "stats": stats,  # RunStats.to_dict(): merged explicitly by export
    }
    outdir.write_bytes(_marker_name(partition), json.dumps(payload, default=str, indent=1).encode())


def read_slice_markers(out: str | OutDir, fingerprint: str | None = None) -> dict[Partition, dict]:
    """Every readable slice marker; with `fingerprint`, markers of another job are ignored."""
    outdir = out if isinstance(out, OutDir) else OutDir(str(out))
    markers: dict[Partition, dict] = {}
    for name in outdir.listdir(SLICES_DIR):
        if not name.endswith(".json") or name.startswith(".tmp-"):
            continue
        try:
            partition = Partition.from_tag(name[: -len(".json")])
            payload = json.loads(outdir.read_bytes(f"{SLICES_DIR}/{name}"))
        except (ValueError, OSError):
            continue  # a foreign or unreadable file is not a done slice
        if fingerprint is not None and payload.get("fingerprint") not in (None, fingerprint):
            continue
        markers[partition] = payload
    return markers


def complete_split(markers: Mapping[Partition, dict]) -> int | None:
    """The slice count N for which all N slices are done (the smallest such N), or None."""
    done: dict[int, set[int]] = {}
    for partition in markers:
        done.setdefault(partition.count, set()).add(partition.index)
    full = [count for count, indexes in done.items() if len(indexes) == count]
    return min(full) if full else None


def check_complete(out: str | OutDir, fingerprint: str | None = None) -> int | None:
    """None for a job that was never split; N when all N slices are done; else raise IncompleteSlices."""
    markers = read_slice_markers(out, fingerprint)
    if not markers:
        return None
    count = complete_split(markers)
    if count is not None:
        return count
    done: dict[int, set[int]] = {}
    for partition in markers:
        done.setdefault(partition.count, set()).add(partition.index)
    raise IncompleteSlices({n: [i for i in range(n) if i not in idx] for n, idx in done.items()})
