"""What lives in an output directory, and per-writer names for --shard slices and Ray workers.

OUT/
  manifest.json            what job this is (spec/model/input fingerprints, total rows)
  lock, lock.<writer>      the live run(s); see io/lock.py
  shards/<writer>-NNNNN.parquet   committed results (the truth)
  errors/<writer>-NNNNN.parquet   committed error records (row, id, kind, message)
  progress/<writer>.json   figures of the current/last run of that writer (for `bulkrun status`)
  slices/sKofN.json        written when slice K of N finished (bulkrun.distributed.slices)
  results.*, errors.*, output.jsonl, metrics.json, report.json   the final files
A single-process run writes shards named part-NNNNN; slice K of N (a --shard run or a Ray worker)
writes part-sKofN-<run id>-NNNNN, so no two processes can ever pick the same file name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bulkrun.io.atomic import write_json_atomic

SINGLE = "part"
FINAL_FILES = (
    "results.parquet",
    "results.jsonl",
    "errors.parquet",
    "errors.jsonl",
    "output.jsonl",
    "metrics.json",
    "report.json",
    "manifest.json",
)
JOB_DIRS = ("shards", "errors", "progress", "slices")


def lock_path(out: Path, writer: str) -> Path:
    return out / ("lock" if writer == SINGLE else f"lock.{writer}")


def write_progress(out: Path, writer: str, figures: dict) -> None:
    (out / "progress").mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "progress" / f"{writer}.json", figures)


def wipe(out: Path) -> None:
    """--restart: remove everything a previous job left (never the lock we hold)."""
    for name in FINAL_FILES:
        (out / name).unlink(missing_ok=True)
    for name in JOB_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)
