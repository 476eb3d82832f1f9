"""Fixtures for job-layer tests: a tiny random model on disk, a fake engine, input writers."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fake_engine import FakeEngine
from helpers.models import build_tokenizer, make_tiny_model

from bulkrun.job.runner import run_job
from bulkrun.job.spec import build_spec


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
