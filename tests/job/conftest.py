"""Fixtures for job-layer tests: a tiny random model on disk, a fake engine, input writers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from jobtest_helpers import FakeEngine, build_tokenizer, make_tiny_model  # noqa: E402

from bulkrun.job.runner import run_job  # noqa: E402
from bulkrun.job.spec import build_spec  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-byte-llama"))


@pytest.fixture(scope="session")
def byte_tokenizer():
    return build_tokenizer()


@pytest.fixture
def run_fake(tiny_model, byte_tokenizer):
    """Run a job on the FakeEngine: run_fake(input=..., out=..., **options) -> report."""

    def run(engine: FakeEngine | None = None, **values) -> dict:
        values.setdefault("model", str(tiny_model))
        values.setdefault("quiet", True)
        values.setdefault("task", "generate")
        spec = build_spec([("test", values)])
        return run_job(spec, engine=engine or FakeEngine(byte_tokenizer))

    return run
