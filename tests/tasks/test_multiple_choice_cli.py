"""`bulkrun eval --choices-field` end to end: per-row choices (any count, multi-token) scored through
the CLI, with bad rows as error records; acc and acc_norm equal lm-evaluation-harness's recipe
computed with plain transformers on the default model (JSONL and Parquet input)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.multiple_choice import ROWS as MC_ROWS
from helpers.multiple_choice import hf_choice_loglikelihoods, lm_eval_acc
from helpers.rows import read_jsonl, write_jsonl
from helpers.tasks import load_hf_model

from bulkrun.cli import main

ENGINE_FLAGS = [
    "--dtype",
    "float32",
    "--kv-cache-bytes",
    "32MiB",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "256",
    "--quiet",
]
# The reference rows with ids; Parquet has one type per column, so answers are indices there.
ROWS = [{"id": f"q{n}", **row} for n, row in enumerate(MC_ROWS)]
# The empty context is scored by lm-evaluation-harness after BOS alone; bulkrun makes it a row error.
BAD = {"q3": "empty_text", "q5": "expected_out_of_range", "q6": "empty_choices"}


def write_input(tmp_path, fmt: str):
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "mc.jsonl", ROWS)
    path = tmp_path / "mc.parquet"
    pq.write_table(pa.Table.from_pylist([row | {"answer": gold(row)} for row in ROWS]), path)
    return path


def gold(row) -> int:
    """The answer as an index (the reference rows give some as a choice's text or a digit string)."""
    answer = row["answer"]
    return row["choices"].index(answer) if answer in row["choices"] else int(answer)


def run_eval(source, out, *flags) -> int:
    args = ["eval", source, "--choices-field", "choices", "--context-field", "question", "--out", out]
    return main([str(a) for a in [*args, *flags, *ENGINE_FLAGS]])


def read_results(out, fmt: str) -> list[dict]:
    if fmt == "jsonl":
        return read_jsonl(out / "results.jsonl")
    return pq.read_table(out / "results.parquet").to_pylist()


def read_errors(out, fmt: str) -> dict[str, str]:
    rows = (
        read_jsonl(out / "errors.jsonl")
        if fmt == "jsonl"
        else pq.read_table(out / "errors.parquet").to_pylist()
    )
    return {r["id"]: r["kind"] for r in rows}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_columns_errors_and_metrics_agree_on_a_tiny_model(tmp_path, tiny_model_dir, fmt):
    out = tmp_path / "out"
    assert run_eval(write_input(tmp_path, fmt), out, "--model", tiny_model_dir) == 3  # row errors
    assert read_errors(out, fmt) == BAD
    results = read_results(out, fmt)
    good = [row for row in ROWS if row["id"] not in BAD]
    assert [r["id"] for r in results] == [row["id"] for row in good]  # the id column, no --id-field
    for record, row in zip(results, good, strict=True):
        lls = record["loglikelihoods"]
        assert len(lls) == len(row["choices"]) and all(ll < 0 for ll in lls)
        assert (record["correct"], record["correct_norm"]) == lm_eval_acc(lls, row["choices"], gold(row))
        assert record["expected"] == row["choices"][gold(row)] and record["expected_index"] == gold(row)
        assert record["predicted"] == row["choices"][record["predicted_index"]]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["kind"] == "multiple_choice" and metrics["items"] == len(good)
    assert metrics["acc"] == sum(r["correct"] for r in results) / len(good)
    assert metrics["acc_norm"] == sum(r["correct_norm"] for r in results) / len(good)


def test_multiple_choice_refuses_labels_and_needs_its_fields(tmp_path):
    source = write_jsonl(tmp_path / "mc.jsonl", ROWS)
    assert run_eval(source, tmp_path / "o1", "--labels", "a,b", "--model", "/no/model") == 2
    assert run_eval(source, tmp_path / "o2", "--expected-field", "gold", "--model", "/no/model") == 2


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_acc_and_acc_norm_equal_transformers_on_the_default_model(
    tmp_path, default_model_dir, tokenizer, fmt
):
    out = tmp_path / "out"
    assert run_eval(write_input(tmp_path, fmt), out) == 3
    assert read_errors(out, fmt) == BAD
    model = load_hf_model(default_model_dir)
    hits = hits_norm = 0
    results = read_results(out, fmt)
    good = [row for row in ROWS if row["id"] not in BAD]
    assert [r["id"] for r in results] == [row["id"] for row in good]
    for record, row in zip(results, good, strict=True):
        expected = hf_choice_loglikelihoods(model, tokenizer, row["question"], row["choices"])
        assert record["loglikelihoods"] == pytest.approx(expected, abs=1e-3)
        acc, acc_norm = lm_eval_acc(expected, row["choices"], gold(row))
        assert (record["correct"], record["correct_norm"]) == (acc, acc_norm)
        hits, hits_norm = hits + acc, hits_norm + acc_norm
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["acc"] == pytest.approx(hits / len(good))
    assert metrics["acc_norm"] == pytest.approx(hits_norm / len(good))
