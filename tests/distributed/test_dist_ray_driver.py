"""The Ray driver's bookkeeping, with a model-free slice runner (fake_slice_runner.py):
results complete and in input order, a worker killed mid-slice loses and duplicates nothing, a job
error or an engine that cannot load stops the run with its own message (no retries)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from helpers.fake_slice_runner import FakeSpec, expected_results, read_results, shard_rows

from bulkrun.errors import InputError, ModelError
from bulkrun.job.slices import check_complete

pytestmark = pytest.mark.ray
RUNNER = "helpers.fake_slice_runner"


def run(spec, **kwargs):
    from bulkrun.distributed.ray_driver import run_on_ray

    return run_on_ray(spec, runner=RUNNER, **kwargs)


def assert_exactly_once(spec):
    assert read_results(spec.out) == expected_results(spec)
    duplicates = [row for row, times in Counter(shard_rows(spec.out)).items() if times > 1]
    assert duplicates == []


def test_two_workers_cover_the_job_in_input_order(ray_cluster, make_rows, tmp_path):
    spec = FakeSpec(input=make_rows(25), out=str(tmp_path / "out"), delay_s=0.0)
    report = run(spec)
    assert_exactly_once(spec)
    assert report["items"] == 25 and report["workers"] == 2 and report["worker_restarts"] == 0
    assert check_complete(spec.out) == 2  # both slices marked done


def test_a_worker_killed_mid_slice_loses_and_duplicates_nothing(ray_cluster, make_rows, tmp_path):
    """os.kill inside the worker (test_dist_ray_job kills one with ray.kill, on the real engine)."""
    spec = FakeSpec(input=make_rows(60), out=str(tmp_path / "out"), delay_s=0.05)
    killed = []

    def kill_once(state):
        busy = [w for w in state.workers if w.partition is not None and w.info]
        if killed or state.items_done < 6 or not busy:
            return
        victim = busy[0]
        killed.append(victim.partition)
        os.kill(victim.info["pid"], signal.SIGKILL)

    report = run(spec, on_tick=kill_once)
    assert killed, "the job ended before a worker could be killed"
    assert report["worker_restarts"] == 1
    assert_exactly_once(spec)


def test_a_job_error_in_a_worker_stops_the_run_with_its_message(ray_cluster, make_rows, tmp_path):
    spec = FakeSpec(input=make_rows(4), out=str(tmp_path / "out"))
    Path(spec.input).unlink()  # workers read the input when their slice starts
    with pytest.raises(InputError, match="does not exist"):
        run(spec)


def test_an_engine_that_cannot_load_stops_the_run_without_retries(ray_cluster, make_rows, tmp_path):
    spec = FakeSpec(input=make_rows(4), out=str(tmp_path / "out"), engine_error="model 'nope' not found")
    deaths = []
    with pytest.raises(ModelError, match="model 'nope' not found"):
        run(spec, on_tick=lambda state: deaths.append(state.deaths))
    assert set(deaths) <= {0}
