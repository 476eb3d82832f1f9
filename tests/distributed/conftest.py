"""One local Ray cluster (2 CPUs) per test module: Ray start-up is slow on a small machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ray_cluster():
    """A local 2-CPU Ray cluster; workers can import this folder's helper modules (fake runner)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'bulkrun[ray]'")
    if ray.is_initialized():
        ray.shutdown()
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    try:
        yield ray
    finally:
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
