"""`bulkrun classify` and `bulkrun eval` end to end on a tiny random model (real engine, real tokenizer)."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.rows import read_jsonl, write_jsonl

from bulkrun.cli import main

ENGINE_FLAGS = ["--dtype", "float32", "--kv-cache-bytes", "16MiB", "--max-num-seqs", "8",
                "--max-num-batched-tokens", "256", "--quiet"]  # fmt: skip
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
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["items"] == 4 and metrics["calibration"]["mode"] == "content-free"
    assert metrics["calibration"]["content_free_inputs"] == ["N/A", "[MASK]", ""]
    prior = metrics["calibration"]["prior"]
    assert sum(prior.values()) == pytest.approx(1.0)
    for row in table.to_pylist():  # the columns agree: raw = softmax of scores, calibrated = raw / prior
        scores = row["label_scores"]
        assert row["raw_label"] == max(scores, key=scores.get)
        total = sum(math.exp(v) for v in scores.values())
        raw = {k: math.exp(v) / total for k, v in scores.items()}
        assert row["raw_label_probs"] == pytest.approx(raw)
        assert row["label_prior"] == pytest.approx(prior)
        ratios = {k: raw[k] / prior[k] for k in raw}
        calibrated = {k: r / sum(ratios.values()) for k, r in ratios.items()}
        assert row["label_probs"] == pytest.approx(calibrated)
        assert row["label"] == max(calibrated, key=calibrated.get)
        assert row["probability"] == pytest.approx(row["label_probs"][row["label"]])


def test_an_id_column_is_the_id_and_calibrate_none_keeps_the_raw_scores(bulkrun, tmp_path, tiny_model_dir):
    source = write_jsonl(tmp_path / "t.jsonl", TICKETS)
    out = tmp_path / "out"
    code, err = bulkrun("classify", source, "--labels", "billing,bug", "--model", tiny_model_dir, "--out", out, "--calibrate", "none", *ENGINE_FLAGS)  # fmt: skip
    assert code == 0, err
    rows = read_jsonl(out / "results.jsonl")
    assert [r["id"] for r in rows] == ["a", "b", "c", "d"]  # no --id-field: the `id` column
    assert json.loads((out / "manifest.json").read_text())["ids"] == {"field": "id", "source": "input column"}
    for row in rows:
        scores = row["label_scores"]
        assert row["label"] == max(scores, key=scores.get) and "raw_label" not in row
    assert json.loads((out / "metrics.json").read_text())["calibration"] == {"mode": "none"}
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"text": t["text"]} for t in TICKETS])
    code, err = bulkrun("classify", plain, "--labels", "billing,bug", "--model", tiny_model_dir, "--out", tmp_path / "o2", *ENGINE_FLAGS)  # fmt: skip
    assert code == 0, err
    assert [r["id"] for r in read_jsonl(tmp_path / "o2" / "results.jsonl")] == ["0", "1", "2", "3"]


def test_a_job_begun_before_ids_were_recorded_keeps_its_row_number_ids(bulkrun, tmp_path, tiny_model_dir):
    source = write_jsonl(tmp_path / "t.jsonl", TICKETS)
    out = tmp_path / "out"
    args = [
        "classify",
        source,
        "--labels",
        "billing,bug",
        "--model",
        tiny_model_dir,
        "--out",
        out,
        *ENGINE_FLAGS,
    ]
    code, err = bulkrun(*args)
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["ids"]  # as written before ids were recorded: row numbers were the ids
    (out / "manifest.json").write_text(json.dumps(manifest))
    for shard in (out / "shards").iterdir():  # the last row was not done yet
        table = pq.read_table(shard)
        rows = [r | {"id": str(r["row"])} for r in table.to_pylist() if r["row"] != 3]
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), shard)
    code, err = bulkrun(*args)
    assert code == 0, err
    assert [r["id"] for r in read_jsonl(out / "results.jsonl")] == ["0", "1", "2", "3"]


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
