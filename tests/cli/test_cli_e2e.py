"""End to end through the CLI and the real engine on a tiny random model: every input format gives
the same greedy outputs in input order; job specs; status and export."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from helpers.models import ENGINE_FLAGS
from helpers.rows import read_jsonl, texts, write_jsonl

from bulkrun.exceptions import EXIT_OK

ROWS = texts(12)


def _common(model) -> list:
    return ["--model", model, "--id-field", "id", "--max-tokens", "6", "--quiet", *ENGINE_FLAGS]


def _outputs(records) -> list[tuple]:
    return [(r["id"], r["text"], r["finish_reason"], r["generated_tokens"]) for r in records]


def test_each_input_format_gives_the_same_results_in_input_order(bulkrun, tmp_path, cli_model):
    jsonl = write_jsonl(tmp_path / "in.jsonl", ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "in.parquet")
    pcsv.write_csv(pa.Table.from_pylist(ROWS), tmp_path / "in.csv")
    for name in ("in.jsonl", "in.parquet", "in.csv"):
        code, _, _ = bulkrun("generate", tmp_path / name, "--out", tmp_path / name.replace(".", "-"),
                             *_common(cli_model))  # fmt: skip
        assert code == EXIT_OK, name
    from_jsonl = read_jsonl(tmp_path / "in-jsonl" / "results.jsonl")
    from_parquet = pq.read_table(tmp_path / "in-parquet" / "results.parquet").to_pylist()
    from_csv = pq.read_table(tmp_path / "in-csv" / "results.parquet").to_pylist()
    assert [r["id"] for r in from_jsonl] == [r["id"] for r in ROWS]
    assert _outputs(from_jsonl) == _outputs(from_parquet) == _outputs(from_csv)
    assert all(r["generated_tokens"] >= 1 and r["prompt_tokens"] > 0 for r in from_jsonl)
    report = json.loads((tmp_path / "in-jsonl" / "report.json").read_text())
    assert report["complete"] and report["items"] == 12 and report["generated_tokens"] > 0
    assert report["mean_running_batch"] > 1 and report["kv_cache_use_peak"] > 0
    del jsonl


def test_length_sorting_and_windows_do_not_change_greedy_results(bulkrun, tmp_path, cli_model):
    path = write_jsonl(tmp_path / "in.jsonl", ROWS)
    bulkrun("generate", path, "--out", tmp_path / "a", "--window", "3", *_common(cli_model))
    bulkrun(
        "generate",
        path,
        "--out",
        tmp_path / "b",
        "--no-sort",
        "--no-enable-prefix-caching",
        *_common(cli_model),
    )
    assert read_jsonl(tmp_path / "a" / "results.jsonl") == read_jsonl(tmp_path / "b" / "results.jsonl")


def test_openai_batch_through_the_cli(bulkrun, tmp_path, cli_model):
    lines = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 4}}
        for i in range(5)
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "batch.jsonl", lines)
    code, _, _ = bulkrun(
        "generate", path, "--out", tmp_path / "out", "--model", cli_model, "--quiet", *ENGINE_FLAGS
    )
    assert code == EXIT_OK
    outputs = read_jsonl(tmp_path / "out" / "output.jsonl")
    assert [o["custom_id"] for o in outputs] == [f"q{i}" for i in range(5)]
    assert all(o["response"]["body"]["usage"]["completion_tokens"] <= 4 for o in outputs)
    assert (tmp_path / "out" / "errors.jsonl").read_text() == ""


def test_run_a_spec_with_overrides_then_status_and_export(bulkrun, tmp_path, cli_model):
    path = write_jsonl(tmp_path / "in.jsonl", ROWS)
    spec = tmp_path / "job.toml"
    spec.write_text(
        f'task = "summarize"\ninput = "{path}"\nout = "{tmp_path / "out"}"\nmodel = "{cli_model}"\n'
        'max_tokens = 50\ninstruction = "Shorten:"\nquiet = true\nkv-cache-bytes = "16MiB"\n'
    )
    code, _, _ = bulkrun("run", spec, "--max-tokens", "5", "--set", 'instruction="Shorten this:"')
    assert code == EXIT_OK
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["spec"]["max_tokens"] == 5 and manifest["spec"]["instruction"] == "Shorten this:"
    assert all(r["generated_tokens"] <= 5 for r in read_jsonl(tmp_path / "out" / "results.jsonl"))
    code, out, _ = bulkrun("status", tmp_path / "out")
    assert code == EXIT_OK and "finished" in out and "done 12" in out and "remaining 0" in out
    code, out, _ = bulkrun("status", tmp_path / "out", "--json")
    assert json.loads(out)["results"] == 12
    (tmp_path / "out" / "results.jsonl").unlink()
    code, _, err = bulkrun("export", tmp_path / "out")
    assert code == EXIT_OK and "exported 12 results" in err
    assert len(read_jsonl(tmp_path / "out" / "results.jsonl")) == 12


def test_progress_and_summary_go_to_stderr(bulkrun, tmp_path, cli_model):
    path = write_jsonl(tmp_path / "in.jsonl", ROWS[:3])
    code, out, err = bulkrun("generate", path, "--out", tmp_path / "o", "--model", cli_model, *ENGINE_FLAGS,
                             "--max-tokens", "2")  # fmt: skip
    assert code == EXIT_OK and out == ""
    assert "item" in err and "bulkrun generate: done" in err and "rows 3: 3 results, 0 errors" in err
