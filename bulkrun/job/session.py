"""Opening a job: checked (validate.py), its model resolved, OUT locked, the manifest kept, before any work.

`open_job(spec)` builds the task, checks the input (format, the columns the options name), resolves
the model once, takes OUT's lock, wipes OUT on --restart, and checks or writes the manifest. Each
failure is a BulkrunError with one clear line. It yields a JobSession: the single-process runner, a
--shard slice and the Ray driver all hold one; `finalize(stats)` merges the committed shards into the
final files once every row is done and writes report.json.

What lives in an output directory:
  manifest.json                    what job this is (spec/model/input fingerprints, total rows)
  lock, lock.<writer>              the live run(s); see io/lock.py
  shards/<writer>-NNNNN.parquet    committed results (the truth)
  errors/<writer>-NNNNN.parquet    committed error records (row, id, kind, message)
  progress/<writer>.json           figures of the current/last run of that writer (`bulkrun status`)
  slices/sKofN.json                written when slice K of N finished (job/slices.py)
  results.*, errors.*, output.jsonl, metrics.json, report.json   the final files
A single-process run writes shards named part-NNNNN; slice K of N (a --shard run or a Ray worker)
writes part-sKofN-<run id>-NNNNN, so no two processes can ever pick the same file name.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bulkrun.exceptions import ModelError, OutputError, UsageError
from bulkrun.io.atomic import make_dirs, write_json_atomic
from bulkrun.io.lock import JobLock, lock_name
from bulkrun.io.manifest import (
    build_manifest,
    describe_change,
    input_fingerprint,
    read_manifest,
    write_or_check_manifest,
)
from bulkrun.io.outdir import is_uri
from bulkrun.io.readers import count_rows
from bulkrun.job.pipeline import InputPipeline, given_ids, input_pipeline, resolve_ids
from bulkrun.job.resume import Committed, RowSet, load_committed
from bulkrun.job.spec import JobSpec
from bulkrun.job.stats import RunStats
from bulkrun.job.validate import build_task, check_input
from bulkrun.tasks.base import Task

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


@dataclass
class JobSession:
    spec: JobSpec
    task: Task
    out: Path
    manifest: dict
    model_path: Path
    lock: JobLock

    @property
    def total_rows(self) -> int:
        return self.manifest["input"]["rows"]

    @property
    def input_format(self) -> str:
        return self.manifest["input"]["format"]

    @property
    def id_field(self) -> str | None:
        """The field ids come from (None: row numbers), as the manifest recorded it when the job
        began; a job begun before ids were recorded keeps its --id-field (row numbers without)."""
        if "ids" in self.manifest:
            return self.manifest["ids"]["field"]
        return (given_ids(self.spec, self.input_format) or {"field": None})["field"]

    def input(self, model, *, done: RowSet | None = None, sort: bool = False, select=None,
              compile_constraints: bool = True) -> InputPipeline:  # fmt: skip
        """The job's input pipeline on `model` (pipeline.py), with the job's own ids."""
        return input_pipeline(
            self.spec, self.task, model, fmt=self.input_format, id_field=self.id_field, done=done,
            sort=sort, select=select, compile_constraints=compile_constraints,
        )  # fmt: skip

    def report(self, stats: RunStats, committed: Committed | None = None,
               select: Callable[[int], bool] | None = None) -> dict:  # fmt: skip
        """This run's figures, plus the job's (from `committed`, the shards as they are now)."""
        report = {
            "task": self.spec.task,
            "out": str(self.out),
            "model": self.manifest["model"].get("ref") or "default",
            **stats.summary(),
        }
        if committed is None:
            return report
        remaining = max(self.total_rows - len(committed.done), 0)
        report |= {
            "rows": self.total_rows,
            "done": len(committed.done),
            "results_total": committed.results,
            "errors_total": committed.errors,
            "remaining": remaining,
            "complete": remaining == 0,
            "files": [],
            "metrics": None,
        }
        if select is not None:  # a slice's own rows (its exit code looks at these only)
            report["selection_done"] = sum(1 for row in committed.done.rows() if select(row))
            report["selection_errors_total"] = sum(1 for row in committed.error_rows.rows() if select(row))
        return report

    def write_progress(self, writer: str, stats: RunStats) -> None:
        make_dirs(self.out / "progress")
        write_json_atomic(self.out / "progress" / f"{writer}.json", self.report(stats))

    def finalize(self, stats: RunStats, extra: dict | None = None) -> dict:
        """The job's report (plus `extra` figures, e.g. the Ray driver's); when every row is done,
        the final files too. Writes report.json."""
        from bulkrun.job.export import write_final_files

        report = self.report(stats, load_committed(self.out)) | (extra or {})
        if report["complete"]:
            final = write_final_files(self.out, self.manifest, self.task)
            report["files"] = final["files"]
            report["metrics"] = final["metrics"]
        write_json_atomic(self.out / "report.json", report)
        return report


@contextmanager
def open_job(spec: JobSpec, *, lock: bool = True, writer: str = SINGLE) -> Iterator[JobSession]:
    """Check task and input (validate.py) and the model, take OUT's lock, check or write the
    manifest (wiping OUT first on --restart when we hold the lock). Yields the session; releases the lock at the end."""
    task, input_path, fmt = check_input(spec)
    model_path, model_info = resolve_model(spec, task)
    out = out_dir(spec)
    job_lock = JobLock(out / lock_name(writer))
    if lock:
        job_lock.acquire()
    try:
        if spec.restart and lock:
            wipe(out)
        manifest = _manifest(spec, task, input_path, fmt, model_info, out)
        yield JobSession(spec, task, out, manifest, model_path, job_lock)
    finally:
        job_lock.release()


def out_dir(spec: JobSpec) -> Path:
    if is_uri(spec.out):
        raise UsageError(f"--out {spec.out}: the job layer writes to local or shared (NFS) paths, not URIs")
    out = Path(spec.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create output directory '{out}': {exc.strerror or exc}") from None
    if not out.is_dir():
        raise OutputError(f"output '{out}' is not a directory")
    return out


def resolve_model(spec: JobSpec, task: Task | None = None) -> tuple[Path, dict]:
    """The model's local directory (the one place a model reference is resolved) and its identity;
    without --model, the task's default model (embed: the shipped embedder), else the default one."""
    from bulkrun.model_source import ModelNotFound, model_fingerprint
    from bulkrun.model_source import resolve_model as resolve

    task = task or build_task(spec)
    try:
        path = resolve(spec.model or task.default_model)
    except ModelNotFound as exc:
        raise ModelError(str(exc)) from None
    return path, {
        "ref": spec.model or task.default_model or "default",
        "path": str(path),
        "fingerprint": model_fingerprint(path),
    }


def load_engine(spec: JobSpec, model_path: Path | None = None):
    """The engine a job (or a Ray worker) runs on; resolves the model unless given its directory."""
    from bulkrun.engine.load import load_engine

    if model_path is None:
        model_path, _ = resolve_model(spec)
    config = spec.engine_config()
    with _loading(model_path):
        return load_engine(str(model_path), config)


@contextmanager
def _loading(model_path: Path):
    """What loading a model directory raises, as the one-line ModelError (exit 5)."""
    try:
        yield
    except (ValueError, OSError, NotImplementedError) as exc:
        raise ModelError(f"cannot load model '{model_path}': {exc}") from None


@dataclass(frozen=True)
class PromptSide:
    """What turning rows into prompts needs of a model (its tokenizer and context length), without
    loading weights or a KV cache: for commands that prepare prompts but run nothing (batch prepare)."""

    tokenizer: object
    max_model_len: int


def load_prompt_side(spec: JobSpec, model_path: Path) -> PromptSide:
    from bulkrun.engine.tokenizer import load_tokenizer  # the engine's own, so prompts tokenize alike
    from bulkrun.model.config import ModelConfig

    with _loading(model_path):
        tokenizer = load_tokenizer(model_path)
        max_len = ModelConfig.from_model_dir(model_path).max_model_len
    return PromptSide(tokenizer, min(max_len, spec.max_model_len or max_len))


def wipe(out: Path) -> None:
    """--restart: remove everything a previous job left (never the lock we hold)."""
    for name in FINAL_FILES:
        (out / name).unlink(missing_ok=True)
    for name in JOB_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)


def _manifest(spec, task, input_path: Path, fmt: str, model_info: dict, out: Path) -> dict:
    input_info = {"path": str(input_path), "format": fmt, **input_fingerprint(input_path)}
    manifest = build_manifest(spec.result_options(type(task)), model_info, input_info)
    manifest["ids"] = resolve_ids(spec, input_path, fmt)
    old = read_manifest(out)
    if old is None or describe_change(old, manifest):  # a new job: count its rows (a reading pass)
        input_info["rows"] = count_rows(input_path, fmt)
    return write_or_check_manifest(out, manifest)
