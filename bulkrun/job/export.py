"""The end of a job: merge the committed shards into the final files, in input order.

- results.jsonl when the input was JSONL (or OpenAI batch JSONL), else results.parquet;
- errors.parquet / errors.jsonl: one record per bad row (row, id, kind, message);
- for OpenAI batch input, output.jsonl and errors.jsonl in OpenAI's batch output format instead of
  the plain error file, so a batch moves off a hosted API with no change downstream;
- metrics.json when the task has end-of-job metrics (eval).
Every file is written atomically; rerunning the export rewrites the same content.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkrun.io.atomic import write_atomic, write_json_atomic
from bulkrun.io.formats import JSONL, OPENAI
from bulkrun.io.openai_batch import error_line, output_line
from bulkrun.io.shards import (
    ERROR_COLUMNS,
    ERRORS_DIR,
    RESULTS_DIR,
    merged_records,
    records_table,
    shard_paths,
)
from bulkrun.tasks.base import Task

WRITE_BATCH = 1024


def output_format(input_format: str) -> str:
    """results.jsonl for JSONL input (OpenAI batch too), results.parquet for Parquet and CSV."""
    return "jsonl" if input_format in (JSONL, OPENAI) else "parquet"


def write_final_files(out: Path, manifest: dict, task: Task | None = None, fmt: str | None = None) -> dict:
    """Write the final files; returns {"results": n, "errors": n, "files": [...], "metrics": ...}."""
    input_format = manifest["input"]["format"]
    fmt = fmt or output_format(input_format)
    collect = task is not None and task.metrics_need_results()
    kept: list[dict] = []
    files = []

    def results() -> Iterator[dict]:
        for record in merged_records(out / RESULTS_DIR):
            if collect:
                kept.append(record)
            yield record

    n_results = _write(out / f"results.{fmt}", results(), fmt, shard_paths(out / RESULTS_DIR))
    files.append(f"results.{fmt}")
    if input_format == OPENAI:
        n_errors = _write_openai(out, manifest)
        files += ["output.jsonl", "errors.jsonl"]
    else:
        errors = merged_records(out / ERRORS_DIR)
        n_errors = _write(out / f"errors.{fmt}", errors, fmt, shard_paths(out / ERRORS_DIR), ERROR_COLUMNS)
        files.append(f"errors.{fmt}")
    summary = {"results": n_results, "errors": n_errors, "files": files, "metrics": None}
    if task is not None:
        metrics = task.summarize(kept)
        if metrics is not None:
            write_json_atomic(out / "metrics.json", metrics)
            summary["metrics"] = metrics
            files.append("metrics.json")
    return summary


def _write(path: Path, records: Iterator[dict], fmt: str, shards: list[Path], columns=("row", "id")) -> int:
    count = 0

    def write_jsonl(tmp: Path) -> None:
        nonlocal count
        with open(tmp, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1

    def write_parquet(tmp: Path) -> None:
        nonlocal count
        schema = _unified_schema(shards, columns)
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for batch in _batches(records):
                writer.write_table(_conform(records_table(batch), schema))
                count += len(batch)

    write_atomic(path, write_jsonl if fmt == "jsonl" else write_parquet)
    return count


def _unified_schema(shards: list[Path], columns) -> pa.Schema:
    if not shards:
        return pa.schema([(name, pa.int64() if name == "row" else pa.string()) for name in columns])
    schemas = [pq.read_schema(p).remove_metadata() for p in shards]
    return pa.unify_schemas(schemas, promote_options="permissive")


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    arrays = []
    for name in schema.names:
        column = table.column(name) if name in table.column_names else pa.nulls(len(table))
        arrays.append(column.cast(schema.field(name).type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _batches(records: Iterator[dict]) -> Iterator[list[dict]]:
    batch = []
    for record in records:
        batch.append(record)
        if len(batch) >= WRITE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _write_openai(out: Path, manifest: dict) -> int:
    model = str(manifest.get("model", {}).get("ref") or "bulkrun-default")
    created = int(time.time())
    errors = 0

    def outputs(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for record in merged_records(out / RESULTS_DIR):
                f.write(json.dumps(output_line(record, model, created), ensure_ascii=False) + "\n")

    def failures(tmp: Path) -> None:
        nonlocal errors
        with open(tmp, "w", encoding="utf-8") as f:
            for record in merged_records(out / ERRORS_DIR):
                f.write(json.dumps(error_line(record), ensure_ascii=False) + "\n")
                errors += 1

    write_atomic(out / "output.jsonl", outputs)
    write_atomic(out / "errors.jsonl", failures)
    return errors


def export_job(out: Path, fmt: str | None = None, force: bool = False) -> dict:
    """`bulkrun export OUT`: write the final files from the committed shards, once all rows are done
    (a split job: once every slice is done; Incomplete lists the missing ones). `force` exports
    whatever is committed so far."""
    from bulkrun.errors import Incomplete, InputError, LockHeld
    from bulkrun.io.manifest import read_manifest
    from bulkrun.job.resume import load_committed
    from bulkrun.job.status import job_status

    manifest = read_manifest(out) if out.is_dir() else None
    if manifest is None:
        raise InputError(f"'{out}' holds no bulkrun job (no manifest.json)")
    status = job_status(out)
    if status["running"] and not force:
        run = status["running"][0]
        raise LockHeld(f"a run is still writing to '{out}' (pid {run['pid']} on {run['host']}); wait for it")
    if status["remaining"] and not force:
        from bulkrun.job.slices import check_complete

        check_complete(str(out))  # raises with the list of slices not done, if the job was split
        raise Incomplete(
            f"{status['remaining']} of {status['rows']} rows are not done yet; rerun the job to finish it "
            "(or export --force for what is committed)"
        )
    task = _task_from_manifest(manifest)
    final = write_final_files(out, manifest, task, fmt)
    committed = load_committed(out)
    report = _previous_report(out) | {
        "task": manifest["spec"].get("task"),
        "out": str(out),
        "rows": status["rows"],
        "done": len(committed.done),
        "results_total": committed.results,
        "errors_total": committed.errors,
        "remaining": status["remaining"],
        "complete": status["remaining"] == 0,
        "files": final["files"],
        "metrics": final["metrics"],
    }
    write_json_atomic(out / "report.json", report)
    return report


def _task_from_manifest(manifest: dict) -> Task | None:
    from bulkrun.job.spec import task_class

    try:
        cls = task_class(manifest["spec"]["task"])
        options = {key: manifest["spec"].get(key, default) for key, default in cls.options.items()}
        return cls.from_options(options)
    except Exception:  # metrics are a bonus: the files are exported without them
        return None


def _previous_report(out: Path) -> dict:
    """This job's run figures: report.json if a run wrote one, else the slices' RunStats merged."""
    from bulkrun.job.slices import read_slice_markers
    from bulkrun.job.stats import RunStats

    path = out / "report.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    markers = read_slice_markers(str(out))
    if not markers:
        return {}
    return RunStats.merge([RunStats.from_dict(m.get("stats") or {}) for m in markers.values()]).summary()
