"""End to end on the default model (SmolLM2-135M-Instruct): the job layer hands the engine exactly
the chat-templated prompt and stores exactly what it generates; OpenAI batch in, OpenAI batch out;
the shipped classify spec on a few tickets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.rows import read_jsonl, write_jsonl

from bulkrun.exceptions import EXIT_OK

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

ENGINE = ["--kv-cache-bytes", "256MiB", "--quiet"]
QUESTIONS = ["What is the capital of France?", "Name three colours.", "Wie spät ist es?", "def add(a, b):"]


@pytest.fixture(scope="module")
def default_model():
    from bulkrun.model_source import resolve_model

    return resolve_model(None)


def test_generate_stores_exactly_what_the_engine_generates(bulkrun, tmp_path, default_model):
    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.core.params import EngineRequest, SamplingParams
    from bulkrun.engine.load import load_engine

    rows = [{"id": f"q{i}", "text": q} for i, q in enumerate(QUESTIONS)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    code, _, _ = bulkrun("generate", path, "--out", tmp_path / "out", "--id-field", "id", "--max-tokens", "12", "--dtype", "float32",
                         *ENGINE)  # fmt: skip
    assert code == EXIT_OK
    results = read_jsonl(tmp_path / "out" / "results.jsonl")
    engine = load_engine(str(default_model), EngineConfig(kv_cache_bytes=256 << 20, dtype="float32"))
    tok = engine.tokenizer
    prompts = [
        list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False))
        for q in QUESTIONS
    ]  # fmt: skip
    direct = engine.generate(
        [EngineRequest(str(i), p, SamplingParams(max_tokens=12)) for i, p in enumerate(prompts)]
    )
    assert [r["text"] for r in results] == [o.text for o in direct]
    assert [r["prompt_tokens"] for r in results] == [len(p) for p in prompts]
    assert "Paris" in results[0]["text"]


def test_openai_batch_on_the_default_model(bulkrun, tmp_path, default_model):
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gpt-4o-mini", "max_tokens": 8, "messages": [
             {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": q}]}}
        for i, q in enumerate(QUESTIONS[:2])
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "batch.jsonl", lines)
    code, _, _ = bulkrun("generate", path, "--out", tmp_path / "out", *ENGINE)
    assert code == EXIT_OK
    outputs = read_jsonl(tmp_path / "out" / "output.jsonl")
    assert [o["custom_id"] for o in outputs] == ["c0", "c1"]
    choice = outputs[0]["response"]["body"]["choices"][0]
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"].strip()
    assert choice["finish_reason"] in ("stop", "length")
    assert outputs[0]["response"]["body"]["usage"]["completion_tokens"] <= 8


# The default model on the 100 shipped tickets, default options (calibrated against the content-free
# prior), reaches the accuracy docs/benchmarks.md records; uncalibrated it labels nearly every ticket
# "shipping". The floor sits a little below the calibrated figure; the raw ceiling pins that
# calibration is what lifts it, and the shipping recall pins the scoring itself.
ACCURACY_FLOOR = 0.40
RAW_ACCURACY_CEILING = 0.30


def test_shipped_classify_spec_reaches_its_accuracy_floor_on_the_shipped_tickets(
    bulkrun, tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)
    tickets = read_jsonl(ROOT / "bulkrun" / "data" / "tickets.jsonl")
    code, _, _ = bulkrun("run", "jobs/classify-tickets.toml", "--out", tmp_path / "out", *ENGINE)
    assert code == EXIT_OK
    results = read_jsonl(tmp_path / "out" / "results.jsonl")
    assert [r["id"] for r in results] == [t["id"] for t in tickets]
    assert results[0]["text"] == tickets[0]["text"]  # keep_fields copies the ticket text
    truth = {t["id"]: t["label"] for t in tickets}
    accuracy = sum(r["label"] == truth[r["id"]] for r in results) / len(results)
    assert accuracy >= ACCURACY_FLOOR
    raw_accuracy = sum(r["raw_label"] == truth[r["id"]] for r in results) / len(results)
    assert raw_accuracy <= RAW_ACCURACY_CEILING
    shipping = [r for r in results if truth[r["id"]] == "shipping"]
    assert len(shipping) == 19 and all(r["label"] == "shipping" for r in shipping)
    metrics_free = json.loads((tmp_path / "out" / "report.json").read_text())
    assert metrics_free["complete"] and metrics_free["items"] == 100
