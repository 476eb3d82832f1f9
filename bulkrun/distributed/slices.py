"""Per-slice "done" markers: how `bulkrun export` knows that every slice of a split job has finished.

A partitioned run (`--shard K/N`, or one Ray worker's slice) that reads its whole slice writes
OUT/slices/s{K}of{N}.json holding its report. The job is complete when, for some N, all N slices are
done (a rerun may use another N: resume goes by committed ids, so any full split covers every row).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from bulkrun.distributed.outfs import OutDir
from bulkrun.distributed.partition import Partition
from bulkrun.errors import Incomplete

SLICES_DIR = "slices"

# Report keys (by the words of their snake_case name) that must not be summed across slices:
# the job's wall time is the longest slice's; ratios and means are averaged, weighted by items.
# Everything else numeric (counts, tokens, throughput of slices running side by side) is summed.
_MAX_WORDS = {"wall", "elapsed", "peak", "started", "finished", "max"}
_MEAN_WORDS = {
    "mean",
    "rate",
    "frac",
    "fraction",
    "ratio",
    "usage",
    "use",
    "util",
    "percent",
    "pct",
    "avg",
    "hit",
}


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
    out: str | OutDir, partition: Partition, report: Mapping[str, Any], fingerprint: str | None = None
) -> None:
    """Record that `partition` has read its whole slice and committed every one of its rows."""
    outdir = out if isinstance(out, OutDir) else OutDir(str(out))
    payload = {
        "index": partition.index,
        "count": partition.count,
        "fingerprint": fingerprint,
        "finished_at": time.time(),
        "report": dict(report),
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


# Throughputs recomputed over the whole job's wall time: key -> the counts it divides.
_RATES = {
    "items_per_s": ("items", "errors"),
    "generated_tokens_per_s": ("generated_tokens",),
    "total_tokens_per_s": ("prompt_tokens", "generated_tokens"),
}


def merge_reports(reports: list[Mapping[str, Any]], wall_s: float | None = None) -> dict[str, Any]:
    """One report from several slices' reports: counts summed, wall time the longest, means weighted.

    With `wall_s` (the whole job's processing time, as the Ray driver measures it) the wall time and
    throughputs are the job's own, not sums of the slices' rates (slices may have run one after another).
    """
    if not reports:
        return {}
    merged = _merge_keys(reports)
    if wall_s is not None:
        merged["wall_time_s"] = round(wall_s, 3)
        for key, counts in _RATES.items():
            merged[key] = round(sum(merged.get(c) or 0 for c in counts) / max(wall_s, 1e-9), 3)
    return merged


def _merge_keys(reports: list[Mapping[str, Any]]) -> dict[str, Any]:
    weights = [float(r.get("items", 0) or 0) for r in reports]
    merged: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in reports for k in r):
        values = [r.get(key) for r in reports]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) != len([v for v in values if v is not None]) or not numbers:
            merged[key] = next((v for v in values if v is not None), None)  # not numeric: first one
        elif _MAX_WORDS & set(key.lower().split("_")):
            merged[key] = max(numbers)
        elif _MEAN_WORDS & set(key.lower().split("_")):
            merged[key] = _weighted_mean(values, weights)
        else:
            merged[key] = sum(numbers)
    return merged


def _weighted_mean(values: list[Any], weights: list[float]) -> float:
    pairs = [(float(v), w) for v, w in zip(values, weights, strict=True) if isinstance(v, (int, float))]
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


def slice_reports(out: str | OutDir, count: int, fingerprint: str | None = None) -> list[dict]:
    """The reports of the N slices of a complete `count`-way split, in slice order."""
    markers = read_slice_markers(out, fingerprint)
    return [markers[Partition(i, count)].get("report", {}) for i in range(count)]
