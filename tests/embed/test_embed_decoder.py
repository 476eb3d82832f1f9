"""A tiny random Qwen3 decoder embedder (Qwen3-Embedding's shape: last-token pooling, normalized, an
instruction prefix for queries) through the engine's pooling requests, against sentence-transformers
fp32: mixed lengths (prompts longer than a step's budget arrive in chunks), truncation, an empty text."""

from __future__ import annotations

import pytest
from embed_models import build_qwen3_embedder, cosines, reference_vectors, word_texts
from helpers.rows import read_jsonl, write_jsonl

import bulkrun
from bulkrun.exceptions import UsageError

INSTRUCT = "w1 w2 w3 "  # the instruction prefix, as Qwen3-Embedding's "Instruct: ...\nQuery:" prompt
ENGINE = {"dtype": "float32", "quiet": True, "kv_cache_bytes": "8MiB", "max_num_seqs": 4, "max_num_batched_tokens": 32,
          "window": 5}  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_embedder(tmp_path_factory):
    return build_qwen3_embedder(
        tmp_path_factory.mktemp("qwen3-emb"), prompts={"query": INSTRUCT, "document": ""}
    )


def _run(model, tmp_path, texts, **options):
    rows = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    report = bulkrun.run(task="embed", input=str(path), out=str(tmp_path / "out"), model=str(model),
                         **(ENGINE | options))  # fmt: skip
    return report, tmp_path / "out"


@pytest.mark.parametrize("prompt", [None, "query"])
def test_qwen3_embedder_matches_sentence_transformers(qwen3_embedder, tmp_path, prompt):
    texts = word_texts([3, 60, 1, 17, 40, 8, 2], seed=7)  # 60 words pass max_seq_length 48
    texts.insert(2, "")
    report, out = _run(qwen3_embedder, tmp_path, texts, prompt_name=prompt)
    assert report["complete"] and report["errors_total"] == 1
    assert read_jsonl(out / "errors.jsonl")[0]["kind"] == "empty_text"
    ids, got = bulkrun.embeddings(out)
    kept = [t for t in texts if t]
    assert ids == [f"t{i}" for i, t in enumerate(texts) if t]
    want = reference_vectors(qwen3_embedder, kept, pooling="last", max_length=48,
                             prompt=INSTRUCT if prompt else "")  # fmt: skip
    assert cosines(got, want).min() >= 0.9999
    results = {r["id"]: r for r in read_jsonl(out / "results.jsonl")}
    assert results["t1"]["truncated"] and results["t1"]["prompt_tokens"] == 48


def test_query_prompt_is_a_literal_prefix(qwen3_embedder, tmp_path):
    texts = word_texts([5, 9], seed=8)
    _, out = _run(qwen3_embedder, tmp_path, texts, query_prompt=INSTRUCT)
    _, got = bulkrun.embeddings(out)
    want = reference_vectors(qwen3_embedder, texts, pooling="last", max_length=48, prompt=INSTRUCT)
    assert cosines(got, want).min() >= 0.9999


def test_mean_pooling_on_a_decoder_stops_before_any_work(qwen3_embedder, tmp_path):
    with pytest.raises(UsageError, match="last token"):
        _run(qwen3_embedder, tmp_path, word_texts([4, 6], seed=9), pooling="mean")
    assert not list((tmp_path / "out").glob("shards/*.parquet"))
