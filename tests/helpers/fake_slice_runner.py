"""A slice runner with no model, for testing the Ray driver's bookkeeping quickly and precisely.

It has the three functions the driver and workers call (build_engine, run_slice, driver_session) and
follows the job layer's rules: committed shards are the only truth, each writer run gets its own file
prefix, a slice skips the rows any writer already committed. "Processing" a row upper-cases its text
after a short sleep, so a test can kill a worker while it is surely mid-slice.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkrun.errors import InputError, ModelError
from bulkrun.job.slices import Partition, mark_slice_done
from bulkrun.job.stats import RunStats


@dataclass
class FakeSpec:
    input: str
    out: str
    ray: str | None = "default"
    workers: int | None = 2
    quiet: bool = True
    delay_s: float = 0.02  # per row
    commit_every: int = 3
    engine_error: str | None = None  # build_engine raises ModelError(engine_error)


def expected_results(spec: FakeSpec) -> list[dict]:
    return [{"row": row, "id": obj["id"], "text": obj["text"].upper()} for row, obj in _rows(spec)]


def shard_rows(out: str) -> list[int]:
    """Every committed row of every shard, duplicates included (a row committed twice shows twice)."""
    rows: list[int] = []
    for path in _shards(out):
        rows.extend(pq.read_table(path, columns=["row"]).column("row").to_pylist())
    return rows


def build_engine(spec: FakeSpec) -> str:
    if spec.engine_error:
        raise ModelError(spec.engine_error)
    return "fake-engine"


def run_slice(spec: FakeSpec, partition: Partition, engine: str, on_progress) -> RunStats:
    committed = set(shard_rows(spec.out))
    mine = [(row, obj) for row, obj in _rows(spec) if partition.owns(row)]
    on_progress(sum(1 for row, _ in mine if row in committed), 0)
    prefix = f"part-{partition.tag}-{uuid.uuid4().hex[:8]}"
    buffer: list[dict] = []
    done = 0
    for row, obj in mine:
        if row in committed:
            continue
        time.sleep(spec.delay_s)
        buffer.append({"row": row, "id": obj["id"], "text": obj["text"].upper()})
        done += 1
        on_progress(1, len(obj["text"]))
        if len(buffer) >= spec.commit_every:
            _commit(spec.out, prefix, buffer)
    _commit(spec.out, prefix, buffer)
    stats = RunStats(items=done, generated_tokens=done)
    mark_slice_done(spec.out, partition, stats.to_dict())
    return stats


class _Session:
    def __init__(self, spec: FakeSpec):
        self.spec = spec
        self.total_rows = len(_rows(spec))

    def finalize(self, stats: RunStats, extra: dict | None = None) -> dict:
        records = {}
        for path in _shards(self.spec.out):
            for record in pq.read_table(path).to_pylist():
                records.setdefault(record["row"], record)
        with open(Path(self.spec.out) / "results.jsonl", "w") as f:
            for row in sorted(records):
                f.write(json.dumps(records[row]) + "\n")
        report = stats.summary() | (extra or {}) | {"results": len(records)}
        (Path(self.spec.out) / "report.json").write_text(json.dumps(report))
        return report


@contextmanager
def driver_session(spec: FakeSpec):
    Path(spec.out).mkdir(parents=True, exist_ok=True)
    yield _Session(spec)


def read_results(out: str) -> list[dict]:
    with open(Path(out) / "results.jsonl") as f:
        return [json.loads(line) for line in f]


def _rows(spec: FakeSpec) -> list[tuple[int, dict]]:
    try:
        with open(spec.input) as f:
            return [(row, json.loads(line)) for row, line in enumerate(f)]
    except FileNotFoundError:
        raise InputError(f"input '{spec.input}' does not exist") from None


def _shards(out: str) -> list[Path]:
    return sorted(p for p in (Path(out) / "shards").glob("part-*.parquet"))


def _commit(out: str, prefix: str, buffer: list[dict]) -> None:
    if not buffer:
        return
    directory = Path(out) / "shards"
    directory.mkdir(parents=True, exist_ok=True)
    number = len(list(directory.glob(f"{prefix}-*.parquet")))
    final = directory / f"{prefix}-{number:05d}.parquet"
    tmp = directory / f".tmp-{final.name}"
    pq.write_table(pa.Table.from_pylist(buffer), tmp)
    os.replace(tmp, final)  # atomic: a kill leaves the shard committed or absent, never half
    buffer.clear()
