"""The ready job specs in jobs/ are valid and run (on the fake engine, from the repository root)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fake_engine import FakeEngine

from bulkrun.job.runner import run_job
from bulkrun.job.session import build_task
from bulkrun.job.spec import spec_from_file

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "jobs").glob("*.toml"))


def test_the_four_uses_are_shipped():
    names = {p.stem for p in SPECS}
    assert {"classify-tickets", "synthetic-data", "eval-tickets", "summarize-archive"} <= names


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_shipped_spec_is_valid_and_runs(path, tmp_path, tiny_model, byte_tokenizer, monkeypatch):
    monkeypatch.chdir(ROOT)  # spec paths are relative to the repository root, like `make demo`
    spec = spec_from_file(path, {"out": str(tmp_path / "out"), "model": str(tiny_model), "quiet": True})
    assert Path(spec.input).exists()
    build_task(spec)
    report = run_job(spec, engine=FakeEngine(byte_tokenizer, max_model_len=4096))  # 1 token per byte
    assert report["complete"] and report["errors_total"] == 0 and report["results_total"] > 0
