"""The ready job specs in jobs/ are valid and run (on the fake engine, from the repository root)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fake_engine import FakeEngine

from bulkrun.job.constraints import job_constraint
from bulkrun.job.runner import run_job
from bulkrun.job.spec import spec_from_file
from bulkrun.job.validate import build_task

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
    if job_constraint(spec) is not None:  # the fake engine has no grammar: see the default-model test
        return
    report = run_job(spec, engine=FakeEngine(byte_tokenizer, max_model_len=4096))  # 1 token per byte
    assert report["complete"] and report["errors_total"] == 0 and report["results_total"] > 0


@pytest.mark.slow
def test_synthetic_data_gives_records_of_its_schema(tmp_path, monkeypatch):
    """The shipped synthetic-data job on the default model, two seed rows, two samples each: every
    record is of the shipped schema (checked with jsonschema); a row whose sample ran past max_tokens
    (the 135M model sometimes repeats itself inside a string) is an invalid_output error record that
    keeps the text, never a patched record."""
    import json

    import jsonschema
    from helpers.rows import read_jsonl

    monkeypatch.chdir(ROOT)
    seeds = (ROOT / "jobs/data/synthetic-seeds.jsonl").read_text().splitlines()[:2]
    (tmp_path / "seeds.jsonl").write_text("\n".join(seeds) + "\n")
    overrides = {"input": str(tmp_path / "seeds.jsonl"), "out": str(tmp_path / "out"), "n": 2, "quiet": True}
    report = run_job(spec_from_file(ROOT / "jobs/synthetic-data.toml", overrides))
    assert report["complete"] and report["results_total"] >= 1, report
    schema = json.loads((ROOT / "jobs/schemas/support-ticket.json").read_text())
    for record in read_jsonl(tmp_path / "out" / "results.jsonl"):
        assert len(record["json"]) == 2 and record["topic"]
        for text, value in zip(record["text"], record["json"], strict=True):
            jsonschema.validate(json.loads(value), schema)
            assert json.loads(text) == json.loads(value)
    errors = tmp_path / "out" / "errors.jsonl"
    for error in read_jsonl(errors) if errors.exists() else []:
        assert error["kind"] == "invalid_output" and "cut by max_tokens" in error["message"]
        assert "text: '{" in error["message"]
