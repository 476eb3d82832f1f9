"""--ray on a local 2-CPU cluster with the real engine on a tiny model: results equal a single-process
run; a worker killed mid-slice loses nothing and duplicates nothing; a rerun after the driver was
killed resumes and finishes with the same results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.rows import committed_rows, duplicated_rows, read_results, spec_values

from bulkrun.cli import main
from bulkrun.io.shards import RESULTS_DIR, shard_paths, shard_rows
from bulkrun.job.slices import Partition
from bulkrun.job.spec import build_spec

pytestmark = pytest.mark.ray


def test_two_workers_give_the_single_process_results(ray_cluster, tiny_job, reference_results, tmp_path):
    source, args = tiny_job
    out = tmp_path / "out"
    assert main(["generate", source, "--out", str(out), *args, "--ray", "--workers", "2"]) == 0
    assert read_results(out) == reference_results
    assert duplicated_rows(out) == []
    report = json.loads((out / "report.json").read_text())
    assert report["workers"] == 2 and report["complete"] and report["results_total"] == len(reference_results)


def _committed_in(out: Path, partition: Partition) -> int:
    paths = [p for p in shard_paths(out / RESULTS_DIR) if p.name.startswith(f"part-{partition.tag}-")]
    return sum(len(shard_rows(p)) for p in paths)


def test_a_worker_killed_mid_slice_loses_nothing(ray_cluster, tiny_job, reference_results, tmp_path):
    from bulkrun.distributed.ray_driver import run_on_ray

    source, args = tiny_job
    out = tmp_path / "out"
    # One sequence at a time: items finish (and shards commit) one by one, not all in one step.
    values = spec_values(source, args, str(out), ray="default", workers=2, max_num_seqs=1)
    spec = build_spec([("test", values)])
    killed: list[Partition] = []

    def kill_after_a_commit(state):
        busy = [w for w in state.workers if w.partition is not None and w.info]
        victims = [w for w in busy if _committed_in(out, w.partition) >= 5]
        if killed or not victims:
            return
        killed.append(victims[0].partition)
        ray_cluster.kill(victims[0].handle)

    report = run_on_ray(spec, runner="helpers.slow_joblayer", on_tick=kill_after_a_commit)
    assert killed, "the job ended before a worker could be killed"
    assert report["worker_restarts"] == 1
    assert read_results(out) == reference_results
    assert duplicated_rows(out) == []


def test_rerun_after_the_driver_is_killed_resumes(ray_cluster, tiny_job, reference_results, tmp_path):
    source, args = tiny_job
    out = tmp_path / "out"
    address = ray_cluster.get_runtime_context().gcs_address
    values = spec_values(source, args, str(out), ray=address, workers=2, max_num_seqs=1)
    here = str(Path(__file__).parent.parent)  # tests/: the helpers package
    script = (  # a driver in its own process, joined to the test's cluster, with slowed workers
        "import json, sys, ray; from bulkrun.job.spec import build_spec;"
        "from bulkrun.distributed.ray_driver import run_on_ray;"
        f"ray.init(address={values['ray']!r}, runtime_env={{'env_vars': {{'PYTHONPATH': {here!r}}}}});"
        f"run_on_ray(build_spec([('test', json.loads(sys.argv[1]))]), runner='helpers.slow_joblayer')"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(values)], env=env,
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "driver.log", "w"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while len(set(committed_rows(out) if out.exists() else [])) < 10 and time.monotonic() < deadline:
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-2000:]
            time.sleep(0.1)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    before = len(set(committed_rows(out)))
    assert 10 <= before < len(reference_results), "the driver was not killed mid-job"
    assert not (out / "results.jsonl").exists()

    assert main(["generate", source, "--out", str(out), *args, "--ray", "--workers", "2"]) == 0
    assert read_results(out) == reference_results
    report = json.loads((out / "report.json").read_text())
    assert report["items"] <= len(reference_results) - before  # only what was left was redone


def test_workers_write_into_one_uri_output(ray_cluster, tiny_job, reference_results, tmp_path):
    """--out as a URI (file:// goes through pyarrow's filesystem layer exactly as s3:// would)."""
    source, args = tiny_job
    remote = tmp_path / "remote"
    assert main(["generate", source, "--out", remote.as_uri(), *args, "--ray", "--workers", "2"]) == 0
    assert read_results(remote) == reference_results
    tags = {p.name.split("-")[1] for p in shard_paths(remote / RESULTS_DIR)}
    assert tags <= {"s0of2", "s1of2"} and tags
    assert duplicated_rows(remote) == []
    assert json.loads((remote / "report.json").read_text())["out"] == remote.as_uri()
    assert not (remote / "lock").exists()
