"""run, plan and batch prepare read a job's rows through one input pipeline (job/pipeline.py): on an
input whose ids come from its `id` column (no --id-field), with duplicate ids and a bad row, all three
give the same ids and the same bad rows."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from helpers.models import ENGINE_FLAGS
from helpers.rows import read_jsonl, texts, write_jsonl

from bulkrun.cli import main
from bulkrun.exceptions import EXIT_ROW_ERRORS
from bulkrun.io.provider_batch.custom_ids import MAP_FILE
from bulkrun.job.batch_export import export_batch
from bulkrun.job.pipeline import resolve_ids
from bulkrun.job.spec import build_spec

ROWS = texts(5) + [
    {"id": "r1", "text": "a duplicate id"},
    {"id": "r3", "text": "another duplicate"},
    {"id": "no-text"},  # a bad row: the field the prompt needs is missing
] + texts(2, start=10)  # fmt: skip


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory):
    from helpers.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("pipeline-tiny-llama"))


def bulkrun(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def flags(model) -> list:
    return ["--model", model, "--max-tokens", "3", "--quiet", *ENGINE_FLAGS]


def test_the_id_rule_takes_the_id_column(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    spec = build_spec([("test", {"input": str(source)})])
    assert resolve_ids(spec, source, "jsonl") == {"field": "id", "source": "input column"}


def test_plan_and_export_batch_see_the_jobs_ids_and_bad_rows(tmp_path, capsys, cli_model):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    code, said = bulkrun(capsys, "generate", source, *flags(cli_model), "--out", tmp_path / "job")
    assert code == EXIT_ROW_ERRORS, said
    job_ids = [r["id"] for r in read_jsonl(tmp_path / "job" / "results.jsonl")]
    job_errors = read_jsonl(tmp_path / "job" / "errors.jsonl")
    assert Counter(e["kind"] for e in job_errors) == {"duplicate_id": 2, "missing_field": 1}
    assert job_ids == ["r0", "r1", "r2", "r3", "r4", "r10", "r11"]

    code, said = bulkrun(capsys, "plan", source, *flags(cli_model), "--no-sample", "--json")
    assert code == 0, said
    plan = json.loads(said[said.index("{") :])
    assert plan["errors_by_kind"] == dict(Counter(e["kind"] for e in job_errors))
    assert plan["good_rows"] == len(job_ids)

    out = tmp_path / "export"
    values = {"input": str(source), "out": str(out), "model": str(cli_model), "max_tokens": 3, "quiet": True}
    export = export_batch(build_spec([("test", values)]), "openai", "m-1")  # the library: no CLI names
    assert export["error_records"] == len(job_errors)
    mapped = read_jsonl(out / "batch" / MAP_FILE)
    assert [m["id"] for m in sorted(mapped, key=lambda m: m["row"])] == job_ids
    assert {m["custom_id"] for m in mapped} == set(job_ids)  # the ids are valid custom_ids as they are
    export_errors = [r for path in sorted((out / "errors").glob("*.parquet")) for r in _rows(path)]
    assert sorted((e["row"], e["id"], e["kind"]) for e in export_errors) == sorted(
        (e["row"], e["id"], e["kind"]) for e in job_errors
    )


def _rows(path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
