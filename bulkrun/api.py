"""bulkrun from Python (a notebook, a script): read a job's output directory as pandas DataFrames and
run a job in-process with the CLI's semantics.

    import bulkrun
    report = bulkrun.run("jobs/classify-tickets.toml", out="runs/tickets", quiet=True)
    df = bulkrun.results("runs/tickets")          # one row per result, in input order
    bulkrun.errors("runs/tickets"), bulkrun.metrics("runs/tickets"), bulkrun.sweep("runs/sweep")
    ids, vectors = bulkrun.embeddings("runs/docs")  # an embed job: ids and an (N, dim) array

The readers take the committed shards, so they work on an unfinished (or running) job too: what has
been committed so far. `run` resumes, takes OUT's lock and refuses a changed job exactly as the CLI
does; the CLI's exit conditions are exceptions (bulkrun.exceptions: UsageError, InputError, ModelError,
LockHeld, JobChanged, OutputError; Incomplete when rows remain), and a job that finished with row
errors returns its report (report["errors_total"] says how many; `errors(OUT)` lists them).
Repeated `run` calls in one process with the same model, device, dtype and kernels load the model
once (bulkrun.execute).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bulkrun.exceptions import Incomplete, InputError


def run(spec_or_path: str | Path | dict | None = None, **options: Any) -> dict:
    """Run a job and return its report (what OUT/report.json holds); a sweep returns
    {"sweep": [one row per run]} (OUT/sweep.json). `spec_or_path` is a TOML job spec's path or a
    dict of spec keys; `options` are spec keys too (input=..., out=..., labels=[...]) and win over it."""
    from bulkrun.execute import is_sweep_spec, run_spec, run_sweep_spec
    from bulkrun.job.spec import build_spec, load_toml

    layers = []
    if isinstance(spec_or_path, dict):
        layers.append(("the spec given to bulkrun.run", spec_or_path))
    elif spec_or_path is not None:
        layers.append((f"job spec '{spec_or_path}'", load_toml(Path(spec_or_path))))
    values = {key: str(value) if isinstance(value, Path) else value for key, value in options.items()}
    layers.append(("bulkrun.run options", values))
    spec = build_spec(layers)
    if is_sweep_spec(spec):
        return {"sweep": run_sweep_spec(spec)}
    report = run_spec(spec)
    if spec.shard is None and not report.get("complete", False):
        raise Incomplete(f"{report.get('remaining')} of {report.get('rows')} rows are not done; run it again")
    return report


def results(out: str | Path):
    """The job's result records as a DataFrame in input order (column `row`), committed ones only."""
    from bulkrun.io.shards import RESULTS_DIR

    return _frame(_records(out, RESULTS_DIR), ("row", "id"))


def embeddings(out: str | Path, column: str = "embedding"):
    """An embed job's vectors: (ids, an (N, dim) numpy array), rows in input order (error rows are
    not there: `errors(OUT)` lists them). Read straight from the committed shards' vector column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bulkrun.io.shards import RESULTS_DIR, shard_paths

    tables = [
        pq.read_table(p, columns=["row", "id", column]) for p in shard_paths(_job_dir(out) / RESULTS_DIR)
    ]
    if not tables:
        return [], np.empty((0, 0), dtype=np.float32)
    table = pa.concat_tables(tables, promote_options="permissive")
    rows = table.column("row").to_numpy()
    order = np.argsort(rows, kind="stable")
    keep = order[np.concatenate(([True], np.diff(rows[order]) != 0))]  # a row committed twice: once
    vectors = table.column(column).combine_chunks()
    if not pa.types.is_fixed_size_list(vectors.type):
        raise InputError(f"'{out}': column '{column}' is not a vector column (is this an embed job?)")
    dim = vectors.type.list_size
    matrix = vectors.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)[keep]
    ids = table.column("id").to_numpy(zero_copy_only=False)[keep].tolist()
    return ids, matrix


def errors(out: str | Path):
    """The job's error records (row, id, kind, message) as a DataFrame in input order."""
    from bulkrun.io.shards import ERROR_COLUMNS, ERRORS_DIR

    return _frame(_records(out, ERRORS_DIR), ERROR_COLUMNS)


def metrics(out: str | Path) -> dict | None:
    """The job's metrics (what metrics.json holds, e.g. accuracy, acc_norm, the calibration prior);
    for an unfinished job, computed over the results committed so far. None for a task without."""
    out = _job_dir(out)
    path = out / "metrics.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    from bulkrun.io.manifest import read_manifest
    from bulkrun.io.shards import RESULTS_DIR, merged_records
    from bulkrun.job.export import task_from_manifest

    task = task_from_manifest(read_manifest(out))
    return None if task is None else task.summarize(merged_records(out / RESULTS_DIR))


def sweep(out: str | Path):
    """An eval sweep's comparison table (OUT/sweep.json) as a DataFrame, one row per run."""
    import pandas as pd

    path = Path(out) / "sweep.json"
    if not path.exists():
        raise InputError(f"'{out}' holds no sweep (no sweep.json)")
    return pd.DataFrame(json.loads(path.read_text(encoding="utf-8"))["runs"])


def _job_dir(out: str | Path) -> Path:
    out = Path(out)
    if not (out / "manifest.json").exists():
        raise InputError(f"'{out}' holds no bulkrun job (no manifest.json)")
    return out


def _records(out: str | Path, directory: str) -> Iterator[dict]:
    from bulkrun.io.shards import merged_records

    return merged_records(_job_dir(out) / directory)


def _frame(records: Iterator[dict], columns):
    import pandas as pd

    rows = list(records)
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(columns))
