"""run_job: one job (or one slice of it) from spec to committed shards, final files and report.

Order of business: check everything that can be checked (task, input, model, lock, manifest) before
any work; then stream the input through the engine, committing shards at every checkpoint; then, when
every row is done, merge the shards into the final files. Interrupted runs keep what was committed,
and a rerun of the same command continues from there.

Distributed runs reuse the same pieces (bulkrun.distributed.joblayer): `job_session` is the driver's
side (lock, manifest, final merge), `build_engine` + `run_job(partition=..., lock=False,
finalize=False)` a worker's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bulkrun.errors import UsageError
from bulkrun.io.lock import JobLock
from bulkrun.io.manifest import (
    build_manifest,
    describe_change,
    input_fingerprint,
    job_fingerprint,
    read_manifest,
    write_or_check_manifest,
)
from bulkrun.io.readers import count_rows, read_rows
from bulkrun.io.shards import ERRORS_DIR, RESULTS_DIR, ShardWriter
from bulkrun.io.windows import PromptBuilder
from bulkrun.job import layout
from bulkrun.job.drive import Checkpointer, Driver
from bulkrun.job.feed import Feed, IdRegistry
from bulkrun.job.progress import Progress
from bulkrun.job.report import job_figures, run_report
from bulkrun.job.resume import load_committed
from bulkrun.job.session import JobSession
from bulkrun.job.setup import build_task, input_format, load_engine, out_dir, resolve_model, task_context
from bulkrun.job.spec import JobSpec
from bulkrun.job.stats import RunStats
from bulkrun.job.values import parse_checkpoint

ProgressHook = Callable[[int, int], None]  # (items, tokens) since the last call


@contextmanager
def job_session(spec: JobSpec, *, lock: bool = True, writer: str = layout.SINGLE) -> Iterator[JobSession]:
    """Check task, input and model, take OUT's lock, check or write the manifest (wiping OUT first
    on --restart when we hold the lock). Yields the session; releases the lock at the end."""
    task = build_task(spec)
    input_path, fmt = input_format(spec)
    model_path, model_info = resolve_model(spec)
    out = out_dir(spec)
    job_lock = JobLock(layout.lock_path(out, writer))
    if lock:
        job_lock.acquire()
    try:
        if spec.restart and lock:
            layout.wipe(out)
        manifest = _manifest(spec, task, input_path, fmt, model_info, out)
        yield JobSession(spec, task, out, manifest, model_path, job_lock)
    finally:
        job_lock.release()


def build_engine(spec: JobSpec):
    """The engine a job (or a Ray worker) runs on."""
    model_path, _ = resolve_model(spec)
    return load_engine(spec, model_path)


def run_job(
    spec: JobSpec,
    *,
    engine=None,
    partition=None,
    select: Callable[[int], bool] | None = None,
    lock: bool = True,
    finalize: bool | None = None,
    on_progress: ProgressHook | None = None,
) -> dict:
    """Run the job (or slice K of N: `partition`, or any `select`ed rows) and return its report.

    The report has the run's figures (items, errors, tokens, throughput, ...) and the job's
    (rows, done, results, errors, remaining, complete)."""
    partition = _partition(spec, partition)
    if partition is not None and spec.restart and lock:
        raise UsageError(
            "--restart cannot be combined with --shard: restart the whole job once without --shard"
        )
    if finalize is None:
        finalize = partition is None and select is None
    writer = layout.SINGLE if partition is None else partition.tag
    with job_session(spec, lock=lock, writer=writer) as session:
        if engine is None:
            engine = load_engine(spec, session.model_path)
        session.task.bind(task_context(spec, engine))
        if partition is not None:
            select = _both(select, partition.owns)
        stats = _stream(session, engine, writer, select, on_progress)
        report = run_report(session, stats)
        if select is not None:
            report.update(_selection_figures(session.out, select))
        if partition is not None:
            from bulkrun.distributed.slices import mark_slice_done

            mark_slice_done(str(session.out), partition, report, job_fingerprint(session.manifest))
        return session.finalize(report) if finalize else report | job_figures(session)


def _selection_figures(out: Path, select: Callable[[int], bool]) -> dict:
    committed = load_committed(out)
    return {
        "selection_done": sum(1 for row in committed.done.rows() if select(row)),
        "selection_errors_total": sum(1 for row in committed.error_rows.rows() if select(row)),
    }


def _partition(spec: JobSpec, partition):
    if partition is None and spec.shard is None:
        return None
    from bulkrun.distributed.partition import parse_shard

    return parse_shard(partition if partition is not None else spec.shard)


def _manifest(spec, task, input_path: Path, fmt: str, model_info: dict, out: Path) -> dict:
    input_info = {"path": str(input_path), "format": fmt, **input_fingerprint(input_path)}
    manifest = build_manifest(spec.result_options(type(task)), model_info, input_info)
    old = read_manifest(out)
    if old is None or describe_change(old, manifest):  # a new job: count its rows (a reading pass)
        input_info["rows"] = count_rows(input_path, fmt)
    return write_or_check_manifest(out, manifest)


def _stream(session: JobSession, engine, writer: str, select, on_progress: ProgressHook | None) -> RunStats:
    spec, out = session.spec, session.out
    # One process per shard-file prefix: slices and Ray workers add a fresh run id.
    prefix = (
        layout.SINGLE
        if writer == layout.SINGLE and select is None
        else f"part-{writer}-{uuid.uuid4().hex[:8]}"
    )
    committed = load_committed(out)
    stats = RunStats()
    results, errors = ShardWriter(out / RESULTS_DIR, prefix), ShardWriter(out / ERRORS_DIR, prefix)
    builder = PromptBuilder(
        session.task, engine.tokenizer, chat_template=spec.chat_template, system=spec.system,
        max_model_len=engine.max_model_len,
    )  # fmt: skip
    id_field = "custom_id" if session.input_format == "openai" else spec.id_field
    feed = Feed(
        read_rows(Path(spec.input), session.input_format), builder, IdRegistry(id_field),
        done=committed.done, window=spec.window, sort=spec.sort_by_length, select=select,
    )  # fmt: skip
    already = len(committed.done) if select is None else sum(1 for r in committed.done.rows() if select(r))
    total = session.total_rows if select is None else None
    # A caller with its own progress hook (a Ray worker) shows one bar for everyone: none here.
    progress = Progress(total, already, stats, quiet=spec.quiet or on_progress is not None, label=spec.task)
    driver = Driver(engine, session.task, results, errors, stats, keep_fields=spec.keep_fields)
    driver.on_record, driver.on_step = _hooks(progress, stats, on_progress, already)

    def commit() -> None:
        results.commit()
        errors.commit()
        session.lock.heartbeat()
        layout.write_progress(out, writer, run_report(session, stats))

    try:
        items, seconds = parse_checkpoint(spec.checkpoint_every)
        driver.run(feed.windows(), Checkpointer(items, seconds, commit, session.lock.heartbeat))
    finally:
        feed.close()
        progress.close()
        commit()  # finished records are complete: keep them whatever stopped us
    return stats


def _hooks(progress: Progress, stats: RunStats, on_progress: ProgressHook | None, already: int):
    if on_progress is None:
        return progress.record, progress.step
    on_progress(already, 0)
    sent = [0]

    def record() -> None:
        progress.record()
        on_progress(1, stats.generated_tokens - sent[0])
        sent[0] = stats.generated_tokens

    return record, progress.step


def _both(a: Callable[[int], bool] | None, b: Callable[[int], bool]) -> Callable[[int], bool]:
    return b if a is None else (lambda index: a(index) and b(index))
