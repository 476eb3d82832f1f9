"""Fixtures for the distributed tests: one local Ray cluster (2 CPUs) shared by consecutive Ray tests,
since Ray start-up is slow on a small machine; a tiny model, an input and its single-process results."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers.models import make_tiny_model
from helpers.rows import read_results, write_rows

TESTS = Path(__file__).resolve().parent.parent  # Ray workers import helpers.* from here

ROWS = 60


@pytest.fixture
def ray_cluster():
    """A local 2-CPU Ray cluster, started by the first test that needs it and shared by the tests that
    follow; its workers can import this folder's modules (the fake runner, the slowed door)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'bulkrun[ray]'")
    if not ray.is_initialized():
        path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
    return ray


def pytest_runtest_teardown(item, nextitem):
    """Stop Ray as soon as the run moves on to tests that do not use it (it holds ~700 MB)."""
    if "ray_cluster" in item.fixturenames and (
        nextitem is None or "ray_cluster" not in nextitem.fixturenames
    ):
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()


@pytest.fixture
def make_rows(tmp_path):
    def build(count: int, name: str = "input.jsonl") -> str:
        path = tmp_path / name
        with open(path, "w") as f:
            for row in range(count):
                f.write(json.dumps({"id": f"r{row}", "text": f"item number {row}"}) + "\n")
        return str(path)

    return build


@pytest.fixture(scope="session")
def tiny_job(tmp_path_factory):
    """(input path, the job's options as CLI arguments) for a real-engine job on a tiny model."""
    folder = tmp_path_factory.mktemp("dist-job")
    model = make_tiny_model(folder / "model")
    source = write_rows(folder / "input.jsonl", ROWS)
    # Small checkpoints: a slice commits several shards, so a kill can land between two of them.
    args = ["--model", str(model), "--id-field", "id", "--max-tokens", "12", "--no-chat-template",
            "--checkpoint-every", "5", "--quiet"]  # fmt: skip
    return str(source), args


@pytest.fixture(scope="session")
def reference_results(tiny_job, tmp_path_factory):
    """The job's results from one plain single-process run."""
    from bulkrun.cli import main

    source, args = tiny_job
    out = tmp_path_factory.mktemp("dist-reference") / "out"
    assert main(["generate", source, "--out", str(out), *args]) == 0
    results = read_results(out)
    assert [r["row"] for r in results] == list(range(ROWS))
    return results
