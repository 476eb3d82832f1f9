"""Shards, merge, manifest and lock: the pieces that make resume exactly-once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from bulkrun.errors import JobChanged, LockHeld
from bulkrun.io import shards as merge_module
from bulkrun.io.lock import STALE_AFTER_S, JobLock
from bulkrun.io.manifest import build_manifest, input_fingerprint, write_or_check_manifest
from bulkrun.io.shards import ShardWriter, merged_records, shard_row_range
from bulkrun.job.resume import RowSet, load_committed


def test_shard_writer_commits_sorted_numbered_shards_and_cleans_temporaries(tmp_path):
    directory = tmp_path / "shards"
    directory.mkdir()
    (directory / ".tmp-part-00000.parquet.999").write_bytes(b"half a file")
    writer = ShardWriter(directory)
    assert not (directory / ".tmp-part-00000.parquet.999").exists()
    for row in (5, 2, 9):
        writer.add({"row": row, "id": str(row), "text": f"t{row}"})
    first = writer.commit()
    assert writer.commit() is None  # nothing buffered
    writer.add({"row": 1, "id": "1", "text": "t1"})
    second = writer.commit()
    assert (first.name, second.name) == ("part-00000.parquet", "part-00001.parquet")
    assert pq.read_table(first)["row"].to_pylist() == [2, 5, 9]
    assert shard_row_range(first) == (2, 9, 3)
    assert ShardWriter(directory)._next == 2  # a new writer continues the numbering


def test_merge_orders_rows_across_shards_opens_them_lazily_and_drops_duplicates(tmp_path, monkeypatch):
    directory = tmp_path / "shards"
    writer = ShardWriter(directory)
    chunks = [[3, 0, 1], [2, 4], [5, 7, 6], [8], [9, 1]]  # 1 twice: must come out once
    for chunk in chunks:
        for row in chunk:
            writer.add({"row": row, "id": f"i{row}"})
        writer.commit()
    opened = []
    real = merge_module.iter_shard_records
    monkeypatch.setattr(merge_module, "iter_shard_records", lambda p: (opened.append(p.name), real(p))[1])
    stats = {}
    records = []
    for record in merged_records(directory, stats):
        records.append(record)
        # lazily: a shard is opened only once the merge has reached its first row
        assert all(shard_row_range(directory / name)[0] <= record["row"] for name in opened)
    assert [r["row"] for r in records] == list(range(10))
    assert stats["duplicates"] == 1
    assert len(opened) == len(chunks)


def test_load_committed_counts_results_and_errors(tmp_path):
    results, errors = ShardWriter(tmp_path / "shards"), ShardWriter(tmp_path / "errors")
    for row in (0, 1, 3):
        results.add({"row": row, "id": str(row)})
    errors.add({"row": 2, "id": "2", "kind": "empty_text", "message": "empty"})
    results.commit()
    errors.commit()
    state = load_committed(tmp_path)
    assert (state.results, state.errors, len(state.done)) == (3, 1, 4)
    assert 2 in state.done and 2 in state.error_rows and 4 not in state.done


def test_rowset_bitmap():
    rows = RowSet()
    assert rows.add(10) and not rows.add(10) and rows.add(100_000) and rows.add(0)
    assert list(rows.rows()) == [0, 10, 100_000] and len(rows) == 3 and 11 not in rows


def test_input_fingerprint_sees_appends_and_edits_but_not_moves(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"x" * 5_000_000)
    before = input_fingerprint(path)
    moved = tmp_path / "moved.jsonl"
    os.rename(path, moved)
    assert input_fingerprint(moved) == before
    data = bytearray(moved.read_bytes())
    data[4_000_000] = ord("y")  # an in-place edit in the sampled middle
    moved.write_bytes(bytes(data))
    assert input_fingerprint(moved) != before
    with open(moved, "ab") as f:
        f.write(b"z")
    assert input_fingerprint(moved)["size"] == 5_000_001


def test_manifest_refuses_a_different_job(tmp_path):
    model = {"ref": "m", "path": "/m", "fingerprint": "abc"}
    input_info = {"path": "in", "format": "jsonl", "size": 3, "sample_sha256": "h", "rows": 1}
    write_or_check_manifest(tmp_path, build_manifest({"temperature": 0.0}, model, input_info))
    write_or_check_manifest(tmp_path, build_manifest({"temperature": 0.0}, model, input_info))  # same job
    with pytest.raises(JobChanged, match="temperature: 0.0 -> 0.7"):
        write_or_check_manifest(tmp_path, build_manifest({"temperature": 0.7}, model, input_info))
    with pytest.raises(JobChanged, match="model changed"):
        write_or_check_manifest(
            tmp_path, build_manifest({"temperature": 0.0}, model | {"fingerprint": "x"}, input_info)
        )


def _write_lock(path, **holder):
    path.write_text(json.dumps(holder))


def test_lock_blocks_while_its_holder_lives_and_is_released(tmp_path):
    path = tmp_path / "lock"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import psutil

        started = psutil.Process(child.pid).create_time()
        _write_lock(path, pid=child.pid, hostname=socket.gethostname(), started=started)
        with pytest.raises(LockHeld, match=f"pid {child.pid}"):
            JobLock(path).acquire()
    finally:
        child.kill()
        child.wait()
    lock = JobLock(path)  # its holder is dead now: the stale lock is taken over
    lock.acquire()
    assert json.loads(path.read_text())["pid"] == os.getpid()
    lock.release()
    assert not path.exists()


def test_stale_locks_pid_reuse_and_other_hosts(tmp_path):
    path = tmp_path / "lock"
    # our own pid, but another process start time: the pid was reused, the lock is stale
    _write_lock(path, pid=os.getpid(), hostname=socket.gethostname(), started=1.0)
    with JobLock(path):
        pass
    # another host: live while its heartbeat is fresh, stale once it is old
    _write_lock(path, pid=1, hostname="elsewhere", started=1.0)
    with pytest.raises(LockHeld, match="elsewhere"):
        JobLock(path).acquire()
    old = time.time() - STALE_AFTER_S - 10
    os.utime(path, (old, old))
    with JobLock(path):
        assert json.loads(path.read_text())["hostname"] == socket.gethostname()
