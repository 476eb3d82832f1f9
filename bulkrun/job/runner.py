"""run_job and run_slice: one job (or one slice of it) from spec to committed shards.

Order of business: open the job (session.py checks everything that can be checked before any work);
then stream the input through the engine, committing shards at every checkpoint; then, when every
row is done, merge the shards into the final files. Interrupted runs keep what was committed, and a
rerun of the same command continues from there.

A Ray worker calls `run_slice` on an engine it loaded once (session.load_engine); the Ray driver
holds the job open with `open_job` and finalizes it with the slices' merged RunStats.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from bulkrun.exceptions import UsageError
from bulkrun.io.manifest import job_fingerprint
from bulkrun.io.shards import ERRORS_DIR, RESULTS_DIR, ShardWriter
from bulkrun.job.calibrate import calibrate_task
from bulkrun.job.loop import Checkpointer, JobLoop, ProgressBar
from bulkrun.job.resume import load_committed
from bulkrun.job.session import SINGLE, JobSession, load_engine, open_job
from bulkrun.job.slices import Partition, mark_slice_done, parse_shard
from bulkrun.job.spec import JobSpec, parse_checkpoint
from bulkrun.job.stats import RunStats

ProgressHook = Callable[[int, int], None]  # (items, tokens) since the last call


def run_job(spec: JobSpec, *, engine=None) -> dict:
    """Run the whole job, or the `--shard K/N` slice the spec names, and return its report: the
    run's figures (items, errors, tokens, throughput, ...) and the job's (rows, done, remaining...)."""
    if spec.shard is None:
        with open_job(spec) as session:
            stats = _stream(session, engine, SINGLE, select=None, on_progress=None)
            return session.finalize(stats)
    if spec.restart:
        raise UsageError(
            "--restart cannot be combined with --shard: restart the whole job once without --shard"
        )
    partition = parse_shard(spec.shard)
    with open_job(spec, writer=partition.tag) as session:
        stats = _slice(session, engine, partition, on_progress=None)
        return session.report(stats, load_committed(session.out), select=partition.owns)


def run_slice(
    spec: JobSpec, partition: Partition, engine, on_progress: ProgressHook | None = None
) -> RunStats:
    """A Ray worker's slice: the Ray driver holds the lock; marks the slice done; returns its RunStats."""
    with open_job(spec, lock=False, writer=partition.tag) as session:
        return _slice(session, engine, partition, on_progress)


def _slice(session: JobSession, engine, partition: Partition, on_progress: ProgressHook | None) -> RunStats:
    stats = _stream(session, engine, partition.tag, partition.owns, on_progress)
    mark_slice_done(str(session.out), partition, stats.to_dict(), job_fingerprint(session.manifest))
    return stats


def _stream(session: JobSession, engine, writer: str, select, on_progress: ProgressHook | None) -> RunStats:
    spec, out = session.spec, session.out
    if engine is None:
        engine = load_engine(spec, session.model_path)
    # One process per shard-file prefix: slices and Ray workers add a fresh run id.
    prefix = SINGLE if select is None else f"part-{writer}-{uuid.uuid4().hex[:8]}"
    committed = load_committed(out)
    stats = RunStats()
    stats.describe_engine(engine)
    results, errors = ShardWriter(out / RESULTS_DIR, prefix), ShardWriter(out / ERRORS_DIR, prefix)
    builder, feed = session.input(engine, done=committed.done, sort=spec.sort_by_length, select=select)
    already = len(committed.done) if select is None else sum(1 for r in committed.done.rows() if select(r))
    total = session.total_rows if select is None else None
    # A caller with its own progress hook (a Ray worker) shows one bar for everyone: none here.
    bar = ProgressBar(total, already, stats, quiet=spec.quiet or on_progress is not None, label=spec.task)
    calibrate_task(session.task, builder, engine)
    loop = JobLoop(engine, session.task, results, errors, stats, keep_fields=spec.keep_fields)
    loop.on_record, loop.on_step = _hooks(bar, stats, on_progress, already)

    def commit() -> None:
        results.commit()
        errors.commit()
        session.lock.heartbeat()
        session.write_progress(writer, stats)

    try:
        items, seconds = parse_checkpoint(spec.checkpoint_every)
        loop.run(feed.windows(), Checkpointer(items, seconds, commit, session.lock.heartbeat))
    finally:
        feed.close()
        bar.close()
        stats.finish()
        commit()  # finished records are complete: keep them whatever stopped us
    return stats


def _hooks(bar: ProgressBar, stats: RunStats, on_progress: ProgressHook | None, already: int):
    if on_progress is None:
        return bar.record, bar.step
    on_progress(already, 0)
    sent = [0]

    def record() -> None:
        bar.record()
        on_progress(1, stats.generated_tokens - sent[0])
        sent[0] = stats.generated_tokens

    return record, bar.step
