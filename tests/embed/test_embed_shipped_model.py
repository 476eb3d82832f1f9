"""The shipped all-MiniLM-L6-v2 end to end through the CLI: per-row cosine against
sentence-transformers fp32, the Parquet vector column, float16 storage, OpenAI /v1/embeddings lines
answered in OpenAI's format (validated with the openai package's own types)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from embed_models import cosines, reference_vectors
from helpers.rows import read_jsonl, write_jsonl

import bulkrun
from bulkrun.cli import main
from bulkrun.model_source import DEFAULT_EMBED_MODEL, resolve_model

TICKETS = [
    "My invoice shows a charge twice this month.",
    "The app crashes when I open the settings page.",
    "Could you add a dark mode?",
    "",
    "Refund please. " * 120,  # ~480 tokens: cut at the model's max_seq_length of 256
    "How do I reset my password?",
    "ünïcödé text, emoji 🎉 and numbers 12345",
]


@pytest.fixture(scope="module")
def minilm():
    return resolve_model(DEFAULT_EMBED_MODEL)


def _parquet_input(tmp_path):
    path = tmp_path / "tickets.parquet"
    pq.write_table(pa.table({"ticket_id": [f"k{i}" for i in range(len(TICKETS))], "body": TICKETS}), path)
    return path


def test_cli_embeds_tickets_like_sentence_transformers(tmp_path, minilm):
    path, out = _parquet_input(tmp_path), tmp_path / "out"
    code = main(["embed", str(path), "--out", str(out), "--id-field", "ticket_id", "--text-field", "body",
                 "--dtype", "float32", "--quiet"])  # fmt: skip
    assert code == 3  # finished, with one row error (the empty ticket)
    assert read_parquet_errors(out) == [("k3", "empty_text")]
    schema = pq.read_schema(out / "results.parquet")
    assert schema.field("embedding").type == pa.list_(pa.float32(), 384)
    table = pq.read_table(out / "results.parquet")
    assert table.column("truncated").to_pylist() == [False, False, False, True, False, False]
    assert table.column("prompt_tokens").to_pylist()[3] == 256
    ids, got = bulkrun.embeddings(out)
    kept = [t for t in TICKETS if t]
    assert ids == [f"k{i}" for i, t in enumerate(TICKETS) if t]
    want = reference_vectors(minilm, kept, max_length=256)
    assert cosines(got, want).min() >= 0.9999


def read_parquet_errors(out):
    errors = pq.read_table(out / "errors.parquet").to_pylist()
    return [(e["id"], e["kind"]) for e in errors]


def test_default_dtype_keeps_cosine_and_float16_halves_storage(tmp_path, minilm):
    path = _parquet_input(tmp_path)
    assert main(["embed", str(path), "--out", str(tmp_path / "a"), "--text-field", "body", "--quiet"]) == 3
    assert main(["embed", str(path), "--out", str(tmp_path / "b"), "--text-field", "body", "--quiet",
                 "--embedding-dtype", "float16"]) == 3  # fmt: skip
    _, default = bulkrun.embeddings(tmp_path / "a")  # bf16 where this CPU has native bf16, else fp32
    _, half = bulkrun.embeddings(tmp_path / "b")
    want = reference_vectors(minilm, [t for t in TICKETS if t], max_length=256)
    assert cosines(default, want).min() >= 0.999
    assert half.dtype == np.float16 and cosines(half, want).min() >= 0.999
    assert pq.read_schema(tmp_path / "b" / "results.parquet").field("embedding").type == pa.list_(
        pa.float16(), 384
    )


def test_openai_embeddings_batch_lines(tmp_path, minilm):
    from openai.types import CreateEmbeddingResponse

    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": TICKETS[0]}},
        {"custom_id": "b", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "input": [TICKETS[1]], "encoding_format": "base64"}},
        {"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": TICKETS[2],
                                                                              "dimensions": 64}},
        {"custom_id": "d", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": ""}},
        {"custom_id": "e", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}},
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "batch.jsonl", lines)
    out = tmp_path / "out"
    assert main(["embed", str(path), "--out", str(out), "--dtype", "float32", "--quiet"]) == 3
    outputs = {line["custom_id"]: line for line in read_jsonl(out / "output.jsonl")}
    assert sorted(outputs) == ["a", "b", "c"]
    want = reference_vectors(minilm, TICKETS[:3])
    for k, custom_id in enumerate("abc"):
        body = outputs[custom_id]["response"]["body"]
        if custom_id == "b":  # little-endian float32, as the openai client decodes it
            raw = body["data"][0]["embedding"]
            body["data"][0]["embedding"] = np.frombuffer(base64.b64decode(raw), dtype="<f4").tolist()
        response = CreateEmbeddingResponse.model_validate(body)
        vector = np.array(response.data[0].embedding)
        assert response.usage.prompt_tokens > 0
        if custom_id == "c":  # the first 64 dimensions, normalized again
            assert vector.shape == (64,) and abs(np.linalg.norm(vector) - 1) < 1e-5
            expected = want[k, :64] / np.linalg.norm(want[k, :64])
        else:
            expected = want[k]
        assert cosines(vector[None], expected[None])[0] >= 0.9999
    errors = {line["custom_id"]: line["error"]["code"] for line in read_jsonl(out / "errors.jsonl")}
    assert errors == {"d": "empty_text", "e": "unsupported_endpoint"}
    json.dumps(outputs)  # plain JSON all the way down


def test_the_bert_tokenizer_loads_without_transformers_and_agrees(minilm):
    from transformers import AutoTokenizer

    from bulkrun.engine.tokenizer import FastTokenizer, load_tokenizer

    ours, theirs = load_tokenizer(minilm), AutoTokenizer.from_pretrained(str(minilm))
    assert isinstance(ours, FastTokenizer)
    texts = [
        *TICKETS,
        "Café naïve ÀÉÎ",
        "中文字符 日本語",
        "UPPER MiXeD $%^&*()",
        " tabs\t\tnew\nline ",
        "a" * 600,
    ]
    for special in (True, False):
        assert (
            ours(texts, add_special_tokens=special)["input_ids"]
            == theirs(texts, add_special_tokens=special)["input_ids"]
        )
