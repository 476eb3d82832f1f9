"""Final outputs: OpenAI batch round trip, --shard slices with export, status."""

from __future__ import annotations

import pytest
from helpers.fake_engine import FakeEngine
from helpers.rows import read_jsonl, texts, write_jsonl

from bulkrun.errors import Incomplete
from bulkrun.job.export import export_job
from bulkrun.job.status import job_status


def _openai_line(custom_id, content, **body):
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **body},
    }


def test_openai_batch_round_trip(tmp_path, run_fake):
    lines = [
        _openai_line("a", "Say hi", max_tokens=3),
        _openai_line("b", "Two answers", n=2, temperature=0.9),
        {"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
        _openai_line("a", "duplicate custom_id"),
        {"custom_id": "d", "url": "/v1/completions", "body": {"prompt": "Once upon"}},
    ]
    path = write_jsonl(tmp_path / "batch.jsonl", lines)
    report = run_fake(input=str(path), out=str(tmp_path / "out"))
    assert report["complete"] and report["errors_total"] == 2
    outputs = read_jsonl(tmp_path / "out" / "output.jsonl")
    assert [o["custom_id"] for o in outputs] == ["a", "b", "d"]
    first = outputs[0]
    assert first["error"] is None and first["response"]["status_code"] == 200
    body = first["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"]
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3  # max_tokens from the request body
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 3
    assert len(outputs[1]["response"]["body"]["choices"]) == 2  # n from the body
    assert outputs[2]["response"]["body"]["object"] == "text_completion"
    errors = read_jsonl(tmp_path / "out" / "errors.jsonl")
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("c", "unsupported_endpoint"),
        ("a", "duplicate_id"),
    ]
    assert all(e["response"] is None for e in errors)
    assert {o["id"] for o in outputs}.isdisjoint({e["id"] for e in errors[:1]})


def test_shard_slices_cover_every_row_once_and_export_merges_them(tmp_path, run_fake, byte_tokenizer):
    path = write_jsonl(tmp_path / "in.jsonl", texts(23))
    run_fake(input=str(path), out=str(tmp_path / "whole"), id_field="id")
    out = tmp_path / "split"
    common = dict(input=str(path), out=str(out), id_field="id")
    first = run_fake(shard="0/3", **common)
    assert not first["complete"] and first["selection_done"] == 8
    run_fake(shard="2/3", **common)
    with pytest.raises(Incomplete, match="1/3"):
        export_job(out)
    assert job_status(out)["slices"]["missing"] == [1]
    run_fake(shard="1/3", **common)
    report = export_job(out)
    assert report["complete"] and report["results_total"] == 23
    assert read_jsonl(out / "results.jsonl") == read_jsonl(tmp_path / "whole" / "results.jsonl")


def test_status_reports_done_errors_remaining(tmp_path, run_fake, byte_tokenizer):
    rows = texts(10)
    rows[3]["text"] = ""
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    run_fake(input=str(path), out=str(out), shard="0/2")
    info = job_status(out)
    assert (info["rows"], info["done"], info["errors"], info["remaining"]) == (10, 5, 0, 5)
    assert info["state"] == "stopped" and info["runs"]
    run_fake(FakeEngine(byte_tokenizer), input=str(path), out=str(out))
    info = job_status(out)
    assert (info["done"], info["results"], info["errors"], info["state"]) == (10, 9, 1, "finished")


def test_export_force_and_format(tmp_path, run_fake):
    path = write_jsonl(tmp_path / "in.jsonl", texts(6))
    out = tmp_path / "out"
    run_fake(input=str(path), out=str(out), shard="1/2")
    with pytest.raises(Incomplete):
        export_job(out)
    report = export_job(out, fmt="parquet", force=True)
    assert not report["complete"] and (out / "results.parquet").exists() and report["results_total"] == 3
