"""Input files and what a job left in its output directory: JSONL writers and readers, shard rows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from bulkrun.io.shards import ERRORS_DIR, RESULTS_DIR, shard_paths, shard_rows


def write_jsonl(path: Path, rows: list) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def texts(n: int, start: int = 0) -> list[dict]:
    """Rows of varied length with string ids."""
    return [{"id": f"r{i}", "text": f"row {i} " + "word " * (i % 7 + 1)} for i in range(start, start + n)]


def write_rows(path: Path, count: int) -> Path:
    """JSONL rows of varied lengths (so windows sort and batches mix), ids r0, r1, ..."""
    with open(path, "w") as f:
        for row in range(count):
            text = " ".join(f"word{row}-{k}" for k in range(1 + row % 7))
            f.write(json.dumps({"id": f"r{row}", "text": text}) + "\n")
    return path


def read_results(out: Path) -> list[dict]:
    return read_jsonl(Path(out) / "results.jsonl")


def committed_rows(out: Path) -> list[int]:
    """Rows of every committed result shard, duplicates included."""
    return [row for path in shard_paths(Path(out) / RESULTS_DIR) for row in shard_rows(path)]


def recorded_rows(out: Path) -> list[int]:
    """Rows of every committed result and error shard, duplicates included."""
    return [
        row
        for sub in (RESULTS_DIR, ERRORS_DIR)
        for path in shard_paths(Path(out) / sub)
        for row in shard_rows(path)
    ]


def duplicated_rows(out: Path) -> list[int]:
    return sorted(row for row, times in Counter(committed_rows(out)).items() if times > 1)


def spec_values(source: str, args: list[str], out: str, **extra) -> dict:
    """The tiny job's CLI arguments (`--flag value` pairs and bare flags) as job-spec values."""
    values: dict = {"task": "generate", "input": source, "out": out}
    rest = list(args)
    while rest:
        flag = rest.pop(0).removeprefix("--")
        if flag.startswith("no-"):
            values[flag[3:].replace("-", "_")] = False
        elif not rest or rest[0].startswith("--"):
            values[flag.replace("-", "_")] = True
        else:
            value = rest.pop(0)
            values[flag.replace("-", "_")] = (
                int(value) if value.isdigit() and flag != "checkpoint-every" else value
            )
    return values | extra
