"""`bulkrun classify` and `bulkrun eval` end to end on a tiny random model (real engine, real tokenizer)."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.rows import read_jsonl, write_jsonl

from bulkrun.cli import main

ENGINE_FLAGS = ["--kv-cache-mem", "16MiB", "--max-seqs", "8", "--max-batch-tokens", "256", "--quiet"]
TICKETS = [
    {"id": "a", "text": "I was charged twice.", "label": "billing"},
    {"id": "b", "text": "The app crashes on start.", "label": "bug"},
    {"id": "c", "text": "Please add dark mode.", "label": "feature"},
    {"id": "d", "text": "Where is my parcel?", "label": "billing"},
]


@pytest.fixture
def bulkrun(capsys):
    def run(*args) -> tuple[int, str]:
        code = main([str(a) for a in args])
        return code, capsys.readouterr().err

    return run


def test_classify_parquet_gives_label_columns_as_a_struct(bulkrun, tmp_path, tiny_model_dir):
    source = tmp_path / "tickets.parquet"
    pq.write_table(pa.Table.from_pylist(TICKETS), source)
    out = tmp_path / "out"
    labels = "billing,bug,feature request"
    code, err = bulkrun("classify", source, "--labels", labels, "--model", tiny_model_dir, "--out", out, "--id-field", "id", *ENGINE_FLAGS)  # fmt: skip
    assert code == 0, err
    table = pq.read_table(out / "results.parquet")
    assert table.column("id").to_pylist() == ["a", "b", "c", "d"]
    assert pa.types.is_struct(table.schema.field("label_probs").type)
    for row in table.to_pylist():  # the columns agree: label = best score, probs = softmax of scores
        scores = row["label_scores"]
        assert row["label"] == max(scores, key=scores.get)
        total = sum(math.exp(v) for v in scores.values())
        assert row["label_probs"] == pytest.approx({k: math.exp(v) / total for k, v in scores.items()})
        assert row["probability"] == pytest.approx(row["label_probs"][row["label"]])
    assert json.loads((out / "metrics.json").read_text())["items"] == 4


@pytest.mark.parametrize(
    "labels, message",
    [("billing", "at least two labels, got only 'billing'"), ("bug,billing,Bug", "duplicate label 'Bug'")],
)
def test_one_label_or_duplicates_are_refused_before_any_work(bulkrun, tmp_path, labels, message):
    source = write_jsonl(tmp_path / "t.jsonl", TICKETS)
    code, err = bulkrun(
        "classify", source, "--labels", labels, "--out", tmp_path / "out", "--model", "/no/model"
    )
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_label_file_with_descriptions(bulkrun, tmp_path, tiny_model_dir):
    source = write_jsonl(tmp_path / "t.jsonl", TICKETS)
    labels = tmp_path / "labels.txt"
    labels.write_text("billing: money matters\nbug: broken things\nfeature\n", encoding="utf-8")
    out = tmp_path / "out"
    code, err = bulkrun(
        "classify", source, "--labels", labels, "--model", tiny_model_dir, "--out", out, *ENGINE_FLAGS
    )
    assert code == 0, err
    assert set(read_jsonl(out / "results.jsonl")[0]["label_probs"]) == {"billing", "bug", "feature"}


def test_eval_with_labels_writes_metrics_and_per_item_correctness(bulkrun, tmp_path, tiny_model_dir):
    source = write_jsonl(tmp_path / "suite.jsonl", TICKETS + [{"id": "e", "text": "x", "label": "refund"}])
    out = tmp_path / "out"
    code, err = bulkrun("eval", source, "--labels", "billing,bug,feature", "--model", tiny_model_dir, "--out", out, "--id-field", "id", *ENGINE_FLAGS)  # fmt: skip
    assert code == 3, err  # the row with an unknown expected label is an error record
    results = read_jsonl(out / "results.jsonl")
    assert [r["expected"] for r in results] == ["billing", "bug", "feature", "billing"]
    assert all(r["correct"] == (r["predicted"] == r["expected"]) for r in results)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["items"] == 4 and metrics["correct"] == sum(r["correct"] for r in results)
    assert set(metrics["confusion"]) == {"billing", "bug", "feature"}
    errors = read_jsonl(out / "errors.jsonl")
    assert [e["id"] for e in errors] == ["e"] and "refund" in errors[0]["message"]


def test_generation_eval_sweep_over_templates(bulkrun, tmp_path, tiny_model_dir):
    rows = [{"id": str(i), "question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(3)]
    source = write_jsonl(tmp_path / "math.jsonl", rows)
    out = tmp_path / "sweep"
    code, err = bulkrun(
        "eval", source, "--model", tiny_model_dir, "--out", out, "--answer-regex", r"(\d+)",
        "--sweep-template", "Q: {question}", "--sweep-template", "Answer briefly. {question}",
        "--max-tokens", "4", *ENGINE_FLAGS,
    )  # fmt: skip
    assert code == 0, err
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["t1", "t2"]
    for name in runs:
        metrics = json.loads((out / "runs" / name / "metrics.json").read_text())
        assert metrics["kind"] == "generation" and metrics["items"] == 3
        assert len(read_jsonl(out / "runs" / name / "results.jsonl")) == 3
    sweep = json.loads((out / "sweep.json").read_text())
    assert [r["name"] for r in sweep["runs"]] == ["t1", "t2"]
    assert "| t2 |" in (out / "sweep.md").read_text()


def test_temperature_sweep_of_a_label_suite_is_refused(bulkrun, tmp_path):
    source = write_jsonl(tmp_path / "t.jsonl", TICKETS)
    code, err = bulkrun(
        "eval", source, "--labels", "billing,bug", "--sweep-temperature", "0,0.5", "--out", tmp_path / "o"
    )
    assert code == 2 and "no effect on a suite with labels" in err
