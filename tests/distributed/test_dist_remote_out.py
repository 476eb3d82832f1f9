"""Output directories behind a URI: the local mirror pulls committed work, uploads new shards once
(and rewritten files again), never uploads temporaries; the advisory remote lock; and a --shard job
written to a file:// URI (pyarrow's filesystem layer, as for s3://) equals a local run."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from helpers.rows import read_results, spec_values

from bulkrun.errors import EXIT_INCOMPLETE, LockHeld
from bulkrun.io.lock import STALE_AFTER_S, JobLock, lock_name
from bulkrun.io.mirror import RemoteMirror, staged
from bulkrun.io.outdir import OutDir


def test_mirror_pulls_committed_files_and_pushes_only_what_is_new(tmp_path):
    remote = tmp_path / "remote"
    (remote / "shards").mkdir(parents=True)
    (remote / "shards" / "part-s0of2-aaaa-00000.parquet").write_bytes(b"committed")
    (remote / "shards" / ".tmp-push-x.parquet").write_bytes(b"half")  # an upload in flight
    (remote / "manifest.json").write_text("{}")
    local = tmp_path / "local"
    mirror = RemoteMirror(remote.as_uri(), local)

    assert mirror.pull() == 2
    assert sorted(os.listdir(local / "shards")) == ["part-s0of2-aaaa-00000.parquet"]
    assert mirror.push() == 0  # nothing new: pulled files are not sent back

    (local / "shards" / "part-s1of2-bbbb-00000.parquet").write_bytes(b"mine")
    (local / "shards" / ".tmp-part-s1of2-bbbb-00001.parquet.123").write_bytes(b"half")
    (local / "progress").mkdir()
    (local / "progress" / "s1of2.json").write_text('{"n": 1}')
    assert mirror.push() == 2
    assert (remote / "shards" / "part-s1of2-bbbb-00000.parquet").read_bytes() == b"mine"
    assert not any(n.startswith(".tmp-part") for n in os.listdir(remote / "shards"))

    time.sleep(0.01)
    (local / "progress" / "s1of2.json").write_text('{"n": 2}')  # rewritten: uploaded again
    assert mirror.push() == 1
    assert json.loads((remote / "progress" / "s1of2.json").read_text()) == {"n": 2}


def test_remote_lock_blocks_a_live_holder_and_takes_over_a_stale_one(tmp_path):
    """The one lock behind a URI: the same liveness rule as a local lock file."""
    remote = OutDir((tmp_path / "remote").as_uri())
    first = JobLock(lock_name("part"), remote)
    first.acquire()
    second = JobLock(lock_name("part"), remote)
    with pytest.raises(LockHeld, match="in use"):
        second.acquire()
    stale = json.loads((tmp_path / "remote" / "lock").read_text())
    stale |= {"hostname": "elsewhere", "heartbeat": stale["heartbeat"] - STALE_AFTER_S - 1}
    (tmp_path / "remote" / "lock").write_text(json.dumps(stale))
    second.acquire()  # the first run (on another host) stopped refreshing: it is dead
    first.release()  # not the holder any more: leaves the lock alone
    assert (tmp_path / "remote" / "lock").exists()
    second.release()
    assert not (tmp_path / "remote" / "lock").exists()
    (tmp_path / "remote" / "lock").write_text(
        json.dumps({"pid": 2**22 + 7, "hostname": socket.gethostname()})
    )
    JobLock("lock", remote).acquire()  # a holder on this host whose process is gone: stale at once
    JobLock(lock_name("s0of2"), remote).acquire()  # slices lock separately


def test_staged_uploads_at_the_end_and_leaves_no_local_mirror(tmp_path):
    remote = tmp_path / "remote"
    with staged(remote.as_uri(), writer="part", lock=True, every_s=3600) as mirror:
        (mirror.local / "shards").mkdir()
        (mirror.local / "shards" / "part-00000.parquet").write_bytes(b"x")
        local = mirror.local
        assert (remote / "lock").exists()
    assert (remote / "shards" / "part-00000.parquet").read_bytes() == b"x"
    assert not local.exists() and not (remote / "lock").exists()


def test_shard_slices_on_a_file_uri_equal_a_local_run(tiny_job, reference_results, tmp_path, capsys):
    from bulkrun.distributed.uri import export_at_uri, run_job_at_uri
    from bulkrun.errors import Incomplete
    from bulkrun.job.spec import build_spec

    source, args = tiny_job
    remote = tmp_path / "remote"

    def spec_for(shard):
        return build_spec([("test", spec_values(source, args, remote.as_uri(), shard=shard))])

    run_job_at_uri(spec_for("0/2"))
    with pytest.raises(Incomplete, match="1/2") as info:
        export_at_uri(remote.as_uri())
    assert info.value.exit_code == EXIT_INCOMPLETE
    run_job_at_uri(spec_for("1/2"))
    report = export_at_uri(remote.as_uri())
    assert report["out"] == remote.as_uri() and report["complete"]
    assert read_results(remote) == reference_results
    assert json.loads((remote / "report.json").read_text())["out"] == remote.as_uri()
