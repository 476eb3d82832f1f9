"""Tiny random BERT and XLM-RoBERTa embedders through the whole embed job, per row against
sentence-transformers in fp32: mixed lengths (packed varlen steps), truncation at max_seq_length,
an empty text as an error record."""

from __future__ import annotations

import numpy as np
import pytest
from embed_models import cosines, reference_vectors, word_texts
from helpers.rows import read_jsonl, write_jsonl

import bulkrun
from bulkrun.exceptions import UsageError

LENGTHS = [1, 5, 30, 12, 2, 22, 40, 7, 22, 3]  # 30 and 40 words pass max_seq_length 24: truncated
FLAGS = {"dtype": "float32", "quiet": True, "window": 4, "max_num_batched_tokens": 48}


def _run(model, tmp_path, texts, **options):
    tmp_path.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    report = bulkrun.run(task="embed", input=str(path), out=str(tmp_path / "out"), model=str(model),
                         **(FLAGS | options))  # fmt: skip
    return report, tmp_path / "out"


@pytest.mark.parametrize(("fixture", "pooling", "normalize"), [("tiny_bert", "mean", True),
                                                                ("tiny_xlmr", "cls", False)])  # fmt: skip
def test_vectors_match_sentence_transformers(fixture, pooling, normalize, request, tmp_path):
    model = request.getfixturevalue(fixture)
    texts = word_texts(LENGTHS, seed=1)
    texts.insert(4, "")  # an empty text: an error record, the job goes on
    report, out = _run(model, tmp_path, texts)
    assert report["complete"] and report["errors_total"] == 1
    errors = read_jsonl(out / "errors.jsonl")
    assert [(e["id"], e["kind"]) for e in errors] == [("t4", "empty_text")]
    ids, got = bulkrun.embeddings(out)
    kept = [t for t in texts if t]
    assert ids == [f"t{i}" for i, t in enumerate(texts) if t]  # input order, whatever the sort
    want = reference_vectors(model, kept, pooling=pooling, normalize=normalize, max_length=24)
    assert got.shape == want.shape and got.dtype == np.float32
    assert cosines(got, want).min() >= 0.9999
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    else:  # not normalized: the vectors themselves agree, not only their directions
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    results = {r["id"]: r for r in read_jsonl(out / "results.jsonl")}
    assert [results[f"t{i}"]["truncated"] for i in (2, 7)] == [True, True]  # 30 and 40 words
    assert results["t2"]["prompt_tokens"] == 24 and not results["t0"]["truncated"]


def test_no_truncate_makes_long_texts_error_records(tiny_bert, tmp_path):
    texts = word_texts([3, 30], seed=2)
    report, out = _run(tiny_bert, tmp_path, texts, truncate=False)
    assert report["errors_total"] == 1
    assert read_jsonl(out / "errors.jsonl")[0]["kind"] == "too_long"


def test_dimensions_cut_then_normalize(tiny_bert, tmp_path):
    texts = word_texts([4, 9, 13], seed=3)
    _, out = _run(tiny_bert, tmp_path, texts, dimensions=16)
    _, got = bulkrun.embeddings(out)
    full = reference_vectors(tiny_bert, texts, max_length=24)[:, :16]
    want = full / np.linalg.norm(full, axis=1, keepdims=True)
    assert got.shape == (3, 16)
    assert cosines(got, want).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_plain_hf_directory_takes_pooling_flags(tmp_path):
    from embed_models import build_encoder

    model = build_encoder("bert", tmp_path / "plain", sentence_transformers=False)
    texts = word_texts([3, 11, 6], seed=4)
    with pytest.raises(UsageError, match="--pooling"):
        _run(model, tmp_path / "a", texts)
    _, out = _run(model, tmp_path / "b", texts, pooling="cls", normalize=True)
    _, got = bulkrun.embeddings(out)
    want = reference_vectors(model, texts, pooling="cls", normalize=True)
    assert cosines(got, want).min() >= 0.9999
