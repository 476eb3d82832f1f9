"""Constraints and chat input through the CLI on the tiny model (real engine, real grammars): every
error path (job-wide: exit 2 before any work; per row: that row's error record), per-row schemas,
`json` columns, invalid_output records that keep the text, chat `messages` rows, OpenAI
response_format, and a constrained sampled job killed mid-way resuming to the same records."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from helpers.rows import read_jsonl, write_jsonl

from bulkrun.exceptions import EXIT_OK, EXIT_ROW_ERRORS, EXIT_USAGE

ENGINE = ["--kv-cache-bytes", "16MiB", "--quiet", "--no-chat-template"]
CHOICES = "yes,no,maybe"
# cannot compile: llguidance refuses "not" (the grammar engine rejects what it cannot enforce)
UNCOMPILABLE = {"type": "object", "patternProperties": {"^a": {}}, "not": {}}


@pytest.fixture
def run(bulkrun, cli_model, tmp_path):
    def go(rows, *flags, out="out"):
        path = rows if not isinstance(rows, list) else write_jsonl(tmp_path / "in.jsonl", rows)
        code, _, err = bulkrun("generate", path, "--out", tmp_path / out, "--model", cli_model, "--id-field",
                               "id", *ENGINE, *flags)  # fmt: skip
        return code, err, tmp_path / out

    return go


def rows(n: int = 4) -> list[dict]:
    return [{"id": f"r{i}", "text": f"question {i}?"} for i in range(n)]


def records(out):
    results = read_jsonl(out / "results.jsonl") if (out / "results.jsonl").exists() else []
    errors = read_jsonl(out / "errors.jsonl") if (out / "errors.jsonl").exists() else []
    return results, errors


def write_schema(tmp_path, schema, name="schema.json"):
    path = tmp_path / name
    path.write_text(json.dumps(schema) if not isinstance(schema, str) else schema)
    return path


# ---- job-wide problems: exit 2 before any work, one line naming the problem -------------------------


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--json-schema", "nowhere.json"], "--json-schema 'nowhere.json' does not exist"),
        (["--regex", "a+", "--choice", "a,b"], "--regex and --choice cannot be combined"),
    ],
)
def test_bad_constraint_flags_stop_before_any_work(run, flags, message):
    code, err, out = run(rows(), *flags)
    assert code == EXIT_USAGE and message in err
    assert not (out / "shards").exists()


def test_a_schema_file_that_is_not_json_or_not_a_schema_is_named(run, tmp_path):
    code, err, _ = run(rows(), "--json-schema", write_schema(tmp_path, "{not json"))
    assert code == EXIT_USAGE and "is not valid JSON" in err
    code, err, _ = run(rows(), "--json-schema", write_schema(tmp_path, {"type": "objekt"}, "s2.json"))
    assert code == EXIT_USAGE and "invalid JSON schema" in err


def test_a_job_schema_that_cannot_compile_stops_the_job_before_any_row(run, tmp_path):
    code, err, out = run(rows(), "--json-schema", write_schema(tmp_path, UNCOMPILABLE))
    assert code == EXIT_USAGE and "--json-schema: json_schema constraint cannot be compiled" in err
    assert not list((out / "shards").glob("*.parquet")) and not list((out / "errors").glob("*.parquet"))


def test_constraints_refused_on_classify(bulkrun, cli_model, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", rows())
    code, _, err = bulkrun(
        "classify", path, "--labels", "a,b", "--choice", "a,b", "--model", cli_model, *ENGINE
    )
    assert code == EXIT_USAGE and "constraints apply to generate, summarize and eval generation suites" in err


# ---- per-row schemas and outputs ------------------------------------------------------------------


def test_choice_outputs_are_choices(run):
    code, _, out = run(rows(), "--choice", CHOICES, "--temperature", "1.0", "--max-tokens", "8")
    results, errors = records(out)
    assert code == EXIT_OK and not errors
    assert {r["text"] for r in results} <= set(CHOICES.split(",")) and len(results) == 4
    assert "json" not in results[0]  # not a JSON constraint: no json column


def test_regex_outputs_match(run):
    code, _, out = run(rows(), "--regex", "[0-9]{3}", "--max-tokens", "8")
    results, _ = records(out)
    assert code == EXIT_OK and all(len(r["text"]) == 3 and r["text"].isdigit() for r in results)


def test_per_row_schemas_bad_ones_are_row_errors(run):
    enum = {"enum": ["red", "green"]}
    data = [
        {"id": "a", "text": "x", "schema": enum},
        {"id": "b", "text": "x", "schema": json.dumps(enum)},  # a string holding a schema
        {"id": "c", "text": "x", "schema": {"type": 5}},  # not a schema
        {"id": "d", "text": "x", "schema": UNCOMPILABLE},  # a schema that cannot compile
        {"id": "e", "text": "x", "schema": "{oops"},  # not JSON
        {"id": "f", "text": "x", "schema": None},  # no schema: free (no job-wide one)
    ]
    code, _, out = run(data, "--schema-field", "schema", "--max-tokens", "12")
    results, errors = records(out)
    assert code == EXIT_ROW_ERRORS
    by_id = {r["id"]: r for r in results}
    assert json.loads(by_id["a"]["json"]) in ("red", "green") and by_id["a"]["json"] == by_id["a"]["text"]
    assert json.loads(by_id["b"]["json"]) in ("red", "green")
    assert by_id["f"]["json"] is None
    kinds = {e["id"]: (e["kind"], e["message"]) for e in errors}
    assert kinds["c"][0] == kinds["d"][0] == kinds["e"][0] == "invalid_schema"
    assert "schema field 'schema'" in kinds["d"][1] and "cannot be compiled" in kinds["d"][1]


def test_a_missing_schema_field_is_a_usage_error(run):
    code, err, _ = run(rows(), "--schema-field", "nope")
    assert code == EXIT_USAGE and "--schema-field 'nope'" in err


def test_output_cut_by_max_tokens_is_invalid_output_keeping_the_text(run, tmp_path):
    schema = {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 50}},
        "required": ["story"],
    }
    code, _, out = run(rows(2), "--json-schema", write_schema(tmp_path, schema), "--max-tokens", "12")
    results, errors = records(out)
    assert code == EXIT_ROW_ERRORS and not results and len(errors) == 2
    assert all(e["kind"] == "invalid_output" and "cut by max_tokens" in e["message"] for e in errors)
    assert all('text: \'{"story":"' in e["message"] for e in errors)  # the text is kept, not patched


# ---- chat input -----------------------------------------------------------------------------------


def test_messages_rows_are_prompts_and_bad_ones_are_named(run):
    good = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    data = [
        {"id": "m1", "messages": good},
        {"id": "m2", "messages": [{"role": "user"}]},
        {"id": "m3", "messages": "hello"},
        {"id": "m4", "messages": [{"role": "robot", "content": "x"}]},
    ]
    code, _, out = run(data, "--max-tokens", "3", "--chat-template")
    results, errors = records(out)
    assert code == EXIT_ROW_ERRORS and [r["id"] for r in results] == ["m1"]
    messages = {e["id"]: e["message"] for e in errors}
    assert messages["m2"] == "messages[0].content is missing"
    assert "must be a list of {role, content} messages, got str" in messages["m3"]
    assert "messages[0].role is 'robot'" in messages["m4"]
    assert all(e["kind"] == "bad_messages" for e in errors)


def test_messages_field_names_another_column(run):
    data = [{"id": "m1", "conv": [{"role": "user", "content": "hi"}], "text": "ignored"}]
    code, _, out = run(data, "--messages-field", "conv", "--max-tokens", "3")
    assert code == EXIT_OK and records(out)[0][0]["id"] == "m1"
    code, err, _ = run(data, "--messages-field", "chat", "--max-tokens", "3", out="o2")
    assert code == EXIT_USAGE and "--messages-field 'chat'" in err


def test_no_text_and_no_messages_column_is_a_usage_error(run):
    code, err, _ = run([{"id": "x", "body_text": "hi"}])
    assert code == EXIT_USAGE and "--text-field 'text'" in err and "nor is there a 'messages' column" in err


# ---- OpenAI batch response_format -------------------------------------------------------------------


def test_openai_response_format_per_line(run, tmp_path):
    def line(cid, fmt):
        body = {"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}
        if fmt is not None:
            body["response_format"] = fmt
        return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}

    enum = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"enum": ["up", "down"]}}}
    lines = [line("a", enum), line("b", None), line("c", {"type": "xml"}), line("d", {"type": "json_schema"})]
    path = write_jsonl(tmp_path / "batch.jsonl", lines)
    code, _, out = run(path)
    results, errors = records(out)
    by_id = {r["id"]: r for r in results}
    assert code == EXIT_ROW_ERRORS
    assert json.loads(by_id["a"]["json"][0]) in ("up", "down") and by_id["b"]["json"] == [None]
    assert {e["custom_id"]: e["error"]["code"] for e in errors} == {
        "c": "invalid_request",
        "d": "invalid_request",
    }


# ---- resume after kill ----------------------------------------------------------------------------

PAUSE_AFTER_FIRST_SHARD = """
import pathlib, sys, time
from bulkrun.io import shards
marker, sys.argv = pathlib.Path(sys.argv[1]), ["bulkrun", *sys.argv[2:]]
commit = shards.ShardWriter.commit
def pausing_commit(self):
    path = commit(self)
    if path is not None and path.parent.name == "shards" and not marker.exists():
        marker.touch()
        time.sleep(120)
    return path
shards.ShardWriter.commit = pausing_commit
from bulkrun.cli import main
main()
"""


def test_a_killed_constrained_job_resumes_to_the_same_records(run, cli_model, tmp_path):
    data = rows(12)
    path = write_jsonl(tmp_path / "in.jsonl", data)
    flags = ["--choice", CHOICES, "--temperature", "1.0", "--seed", "5", "--n", "2", "--max-tokens", "6",
             "--checkpoint-every", "3", "--window", "4", "--max-num-seqs", "2"]  # fmt: skip
    code, _, whole = run(path, *flags, out="whole")
    assert code == EXIT_OK
    out, marker = tmp_path / "killed", tmp_path / "marker"
    args = [
        "generate",
        str(path),
        "--out",
        str(out),
        "--model",
        str(cli_model),
        "--id-field",
        "id",
        *ENGINE,
        *flags,
    ]
    proc = subprocess.Popen([sys.executable, "-c", PAUSE_AFTER_FIRST_SHARD, str(marker), *args])
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert marker.exists() and not (out / "results.jsonl").exists()
    code, _, _ = run(path, *flags, out="killed")
    assert code == EXIT_OK
    assert read_jsonl(out / "results.jsonl") == read_jsonl(whole / "results.jsonl")
