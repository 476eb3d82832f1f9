"""`bulkrun batch collect OUT FILE...`: a provider's batch results committed as shards of the job in OUT.

Pass 1 reads every file through: a broken line, or a result for a custom_id the export never wrote,
stops the import with an error naming it, and nothing is committed. Pass 2 joins each row's samples
into a record shaped like a local run's (bulkrun.io.provider_batch.RowAssembler; kept input fields and
an OpenAI row's endpoint are read back from the input) and commits them as shards
`part-import-<run id>-NNNNN` under OUT's lock, so `status`, `export` and resume see them as any run's.

- Rows already committed (a file imported twice, or a row a local run did meanwhile) add nothing.
- Retryable errors (expired, canceled, overloaded, server errors) are never committed: the row stays
  undone and a plain rerun of the job does it locally. Every other error becomes the row's error record.
- When the import completes the job, the final files are written, as at the end of a local run.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from bulkrun.exceptions import InputError, JobChanged, RowError
from bulkrun.io.atomic import write_json_atomic
from bulkrun.io.lock import JobLock, lock_name
from bulkrun.io.manifest import job_fingerprint, read_manifest
from bulkrun.io.provider_batch import BatchError, RowAssembler, load_export, read_results
from bulkrun.io.readers import read_rows
from bulkrun.io.shards import ERRORS_DIR, RESULTS_DIR, ShardWriter
from bulkrun.job.batch_export import BATCH_DIR, read_job_file
from bulkrun.job.feed import error_record
from bulkrun.job.loop import keep_input_fields
from bulkrun.job.resume import RowSet, load_committed
from bulkrun.job.session import SINGLE
from bulkrun.tasks.constraints import imported_output_columns

IMPORTS_FILE = "imports.json"
COMMIT_EVERY = 1000


def import_batch(out: Path, result_files: list[Path], export_dir: Path | None = None) -> dict:
    """Commit the results in `result_files` into the job in `out`; returns what was imported."""
    out = Path(out)
    manifest = read_manifest(out) if out.is_dir() else None
    if manifest is None:
        raise InputError(
            f"'{out}' holds no bulkrun job (no manifest.json); run `bulkrun batch prepare` there first"
        )
    export_dir = Path(export_dir) if export_dir is not None else out / BATCH_DIR
    export, id_map = load_export(export_dir)
    job = read_job_file(export_dir) or {}
    if job.get("fingerprint") not in (None, job_fingerprint(manifest)):
        raise JobChanged(
            f"the batch export in '{export_dir}' was made for another job than the one in '{out}'"
        )
    for path in result_files:
        if not Path(path).is_file():
            raise InputError(f"result file '{path}' does not exist")
    lock = JobLock(out / lock_name(SINGLE))
    lock.acquire()
    try:
        seen = RowSet()
        for outcome in read_results(result_files, id_map, export.n):  # pass 1: all or nothing
            seen.add(outcome.row)
        extras = _input_extras(manifest, job, seen)
        summary = _commit(out, result_files, id_map, export.n, job, extras)
        _record_import(out, result_files, summary)
    finally:
        lock.release()
    committed = load_committed(out)
    summary["remaining"] = max(manifest["input"]["rows"] - len(committed.done), 0)
    summary["errors_total"] = committed.errors
    if summary["remaining"] == 0:
        from bulkrun.job.export import export_job

        summary["files"] = export_job(out)["files"]
    return summary


def _commit(out: Path, paths, id_map, n: int, job: dict, extras: dict[int, dict]) -> dict:
    prefix = f"part-import-{uuid.uuid4().hex[:8]}"
    results, errors = ShardWriter(out / RESULTS_DIR, prefix), ShardWriter(out / ERRORS_DIR, prefix)
    done = load_committed(out).done
    assembler = RowAssembler(n, as_lists=bool(job.get("openai_input")))
    keep = job.get("keep_fields") or []
    added = {"results": 0, "errors": 0, "already_done": 0}
    for outcome in read_results(paths, id_map, n):
        if outcome.row in done:
            added["already_done"] += 1
            continue
        got = assembler.add(outcome)
        if isinstance(got, BatchError):
            errors.add(got.record())
            added["errors"] += 1
        elif got is not None:
            fields = extras.get(got["row"], {})
            try:  # the same output checks and `json` column as a local run
                got.update(imported_output_columns(got, fields, job))
            except RowError as exc:
                errors.add(error_record(got["row"], got["id"], exc))
                added["errors"] += 1
            else:
                if job.get("openai_input"):
                    got["endpoint"] = fields.get("url")
                results.add(keep_input_fields(got, fields, keep))
                added["results"] += 1
        if len(results) + len(errors) >= COMMIT_EVERY:
            results.commit()
            errors.commit()
    results.commit()
    errors.commit()
    added["already_done"] += assembler.duplicates
    return {
        "out": str(out),
        **added,
        "retryable": [e.record() for e in assembler.retryable],
        "incomplete_rows": assembler.incomplete_rows(),
    }


def _input_extras(manifest: dict, job: dict, rows: RowSet) -> dict[int, dict]:
    """The input fields a local run's records copy (kept fields, an OpenAI row's url), for `rows`."""
    wanted = list(job.get("keep_fields") or []) + (["url", "body"] if job.get("openai_input") else [])
    wanted += [job["schema_field"]] if job.get("schema_field") else []
    if not wanted:
        return {}
    extras = {}
    for index, fields in read_rows(Path(manifest["input"]["path"]), manifest["input"]["format"]):
        if index in rows and isinstance(fields, dict):
            extras[index] = {name: fields.get(name) for name in wanted}
    return extras


def _record_import(out: Path, paths, summary: dict) -> None:
    """OUT/imports.json: every import, in order (what was imported when, and what it added)."""
    path = out / IMPORTS_FILE
    try:
        history = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        history = []
    history.append(
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": [str(p) for p in paths],
            "results": summary["results"],
            "errors": summary["errors"],
            "already_done": summary["already_done"],
            "retryable": len(summary["retryable"]),
        }
    )
    write_json_atomic(path, history)
