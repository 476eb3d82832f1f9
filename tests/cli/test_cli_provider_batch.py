"""`batch prepare` then `batch collect`, through the CLI: the provider's result files (built here in each
provider's documented format, errors and expirations included) become the same results layout as a
local run of the job; status, export and a plain rerun treat the imported shards as a run's."""

from __future__ import annotations

import json

import pytest
from helpers.models import ENGINE_FLAGS
from helpers.provider_batch import (
    anthropic_errored,
    anthropic_ok,
    check_anthropic_entry,
    check_openai_line,
    lines,
    openai_error_line,
    openai_ok,
    write_lines,
)
from helpers.rows import read_jsonl, texts, write_jsonl

from bulkrun.exceptions import EXIT_INCOMPLETE, EXIT_INPUT, EXIT_ROW_ERRORS, EXIT_USAGE
from bulkrun.io.shards import RESULTS_DIR, shard_paths

BAD_ROWS = [{"id": "r1", "text": "a duplicate id"}, {"id": "nofield"}, {"id": "x y", "text": "spaced id"}]


@pytest.fixture
def job(tmp_path, cli_model):
    """The job's input and flags: 6 good rows, a duplicate id, a row without text, an id that is no
    valid custom_id."""
    source = write_jsonl(tmp_path / "in.jsonl", texts(6) + BAD_ROWS)
    flags = ["--model", cli_model, "--id-field", "id", "--max-tokens", "4", "--quiet", *ENGINE_FLAGS]
    return source, flags


def export(bulkrun, job, out, provider):
    source, flags = job
    code, _, err = bulkrun(
        "batch", "prepare", source, *flags, "--out", out, "--provider", provider, "--provider-model", "m-1"
    )
    assert code == 0, err
    return [obj for path in sorted((out / "batch").glob(f"{provider}-*.jsonl")) for obj in lines(path)]


def local_run(bulkrun, job, out):
    source, flags = job
    code, _, err = bulkrun("generate", source, *flags, "--out", out)
    assert code == EXIT_ROW_ERRORS, err
    return read_jsonl(out / "results.jsonl"), read_jsonl(out / "errors.jsonl")


def test_openai_export_then_import_gives_a_local_runs_layout(bulkrun, tmp_path, job):
    results, errors = local_run(bulkrun, job, tmp_path / "local")
    sent = export(bulkrun, job, tmp_path / "batch", "openai")
    for obj in sent:
        check_openai_line(obj)
        assert obj["body"]["model"] == "m-1" and obj["body"]["max_completion_tokens"] == 4
    # the job's bad rows are error records already; the odd id travels as its row number
    assert sorted(o["custom_id"] for o in sent) == ["r0", "r1", "r2", "r3", "r4", "r5", "row-8"]
    by_id = {r["id"]: r for r in results}
    id_of = {o["custom_id"]: o["body"]["messages"][-1]["content"] for o in sent}
    assert id_of["r0"] == texts(1)[0]["text"]
    ok = [openai_ok(cid, [by_id["x y" if cid == "row-8" else cid]["text"]], "length") for cid in id_of]
    output = write_lines(tmp_path / "output.jsonl", ok[:-1])
    failed = write_lines(
        tmp_path / "errors.jsonl", [openai_error_line(sent[-1]["custom_id"], "batch_expired")]
    )
    code, _, err = bulkrun("batch", "collect", tmp_path / "batch", output, failed)
    assert code == EXIT_INCOMPLETE, err  # an expired request is no error record: its row stays to do
    code, _, err = bulkrun(
        "batch", "collect", tmp_path / "batch", write_lines(tmp_path / "late.jsonl", ok[-1:])
    )
    assert code == EXIT_ROW_ERRORS, err  # complete: the final files are written, as after a local run
    imported = read_jsonl(tmp_path / "batch" / "results.jsonl")
    assert [list(r) for r in imported] == [list(r) for r in results]
    assert [(r["row"], r["id"], r["text"]) for r in imported] == [
        (r["row"], r["id"], r["text"]) for r in results
    ]
    assert read_jsonl(tmp_path / "batch" / "errors.jsonl") == errors  # the duplicate r1, nofield
    code, out, _ = bulkrun("status", tmp_path / "batch", "--json")
    assert code == 0 and json.loads(out)["remaining"] == 0


def test_importing_a_file_twice_adds_nothing(bulkrun, tmp_path, job):
    sent = export(bulkrun, job, tmp_path / "out", "openai")
    output = write_lines(tmp_path / "output.jsonl", [openai_ok(o["custom_id"], ["hi"]) for o in sent[:3]])
    assert bulkrun("batch", "collect", tmp_path / "out", output)[0] == EXIT_INCOMPLETE
    shards = shard_paths(tmp_path / "out" / RESULTS_DIR)
    code, out, _ = bulkrun("batch", "collect", tmp_path / "out", output, "--json")
    report = json.loads(out)
    assert code == EXIT_INCOMPLETE and report["results"] == 0 and report["already_done"] == 3
    assert shard_paths(tmp_path / "out" / RESULTS_DIR) == shards


def test_a_result_for_an_unknown_id_is_an_error_naming_it_and_commits_nothing(bulkrun, tmp_path, job):
    sent = export(bulkrun, job, tmp_path / "out", "openai")
    objs = [openai_ok(o["custom_id"], ["hi"]) for o in sent] + [openai_ok("stranger-7", ["hi"])]
    code, _, err = bulkrun("batch", "collect", tmp_path / "out", write_lines(tmp_path / "o.jsonl", objs))
    assert code == EXIT_INPUT and "stranger-7" in err and "Traceback" not in err
    assert shard_paths(tmp_path / "out" / RESULTS_DIR) == []


def test_anthropic_expired_and_errored_requests_then_a_local_rerun_finishes(bulkrun, tmp_path, job):
    results, errors = local_run(bulkrun, job, tmp_path / "local")
    out = tmp_path / "out"
    sent = export(bulkrun, job, out, "anthropic")
    for obj in sent:
        check_anthropic_entry(obj)
    ids = [o["custom_id"] for o in sent]
    expired = {"custom_id": ids[0], "result": {"type": "expired"}}
    objs = [expired, anthropic_errored(ids[1], "invalid_request_error")]
    objs += [anthropic_ok(cid, "ok") for cid in ids[2:]]
    code, _, err = bulkrun("batch", "collect", out, write_lines(tmp_path / "results.jsonl", objs))
    assert code == EXIT_INCOMPLETE, err
    code, status, _ = bulkrun("status", out, "--json")
    assert json.loads(status)["remaining"] == 1  # the expired row: never an error record
    source, flags = job
    code, _, err = bulkrun("generate", source, *flags, "--out", out)  # the plain rerun does it locally
    assert code == EXIT_ROW_ERRORS, err
    final = read_jsonl(out / "results.jsonl")
    assert [r["id"] for r in final] == [r["id"] for r in results if r["id"] != "r1"]
    assert final[0] == results[0]  # the expired row ran here, exactly as in a local run
    errored = [e for e in read_jsonl(out / "errors.jsonl") if e["id"] == "r1"]
    assert [e["kind"] for e in errored] == ["invalid_request_error", "duplicate_id"]  # rows 1 and 6
    assert len(read_jsonl(out / "errors.jsonl")) == len(errors) + 1


def test_classify_cannot_go_to_a_provider_batch(bulkrun, tmp_path, job):
    source, flags = job
    code, _, err = bulkrun(
        "batch", "prepare", source, *flags, "--task", "classify", "--set", "labels=['a','b']",
        "--out", tmp_path / "o", "--provider", "openai", "--provider-model", "m",
    )  # fmt: skip
    assert code == EXIT_USAGE and "locally" in err


def test_an_option_the_provider_cannot_honour_stops_before_any_file(bulkrun, tmp_path, job):
    source, flags = job
    code, _, err = bulkrun(
        "batch", "prepare", source, *flags, "--top-k", "5", "--out", tmp_path / "o",
        "--provider", "openai", "--provider-model", "m",
    )  # fmt: skip
    assert code == EXIT_USAGE and "top_k" in err
    assert not (tmp_path / "o" / "batch" / "batch.json").exists()


def test_openai_batch_input_keeps_its_rows_sampling_and_a_local_runs_columns(bulkrun, tmp_path, cli_model):
    def line(i):
        body = {"model": "x", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2 + i}
        return {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}

    source = write_jsonl(tmp_path / "batch.jsonl", [line(i) for i in range(3)])
    flags = ["--model", cli_model, "--quiet", *ENGINE_FLAGS]
    assert bulkrun("generate", source, *flags, "--out", tmp_path / "local")[0] == 0
    code, _, err = bulkrun(
        "batch", "prepare", source, *flags, "--out", tmp_path / "out", "--provider", "anthropic",
        "--provider-model", "m",
    )  # fmt: skip
    assert code == 0, err
    sent = lines(tmp_path / "out" / "batch" / "anthropic-00001.jsonl")
    assert [o["params"]["max_tokens"] for o in sent] == [2, 3, 4]
    results = write_lines(tmp_path / "r.jsonl", [anthropic_ok(o["custom_id"], "ok") for o in sent])
    assert bulkrun("batch", "collect", tmp_path / "out", results)[0] == 0
    local = read_jsonl(tmp_path / "local" / "results.jsonl")
    imported = read_jsonl(tmp_path / "out" / "results.jsonl")
    assert [list(r) for r in imported] == [list(r) for r in local]
    assert [(r["id"], r["text"], r["endpoint"]) for r in imported] == [
        (f"q{i}", ["ok"], "/v1/chat/completions") for i in range(3)
    ]
    assert len(read_jsonl(tmp_path / "out" / "output.jsonl")) == 3


def test_a_json_schema_job_imports_with_its_json_column_and_invalid_outputs_as_errors(bulkrun, tmp_path, job):
    """The provider enforces the schema it was sent, but import checks every output as a local run
    does: a valid one gets its parsed `json` column, one that does not validate is an error record."""
    source, flags = job
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    )
    out = tmp_path / "out"
    code, _, err = bulkrun(
        "batch", "prepare", source, *flags, "--json-schema", schema, "--out", out,
        "--provider", "openai", "--provider-model", "m-1",
    )  # fmt: skip
    assert code == 0, err
    sent = [obj for path in sorted((out / "batch").glob("openai-*.jsonl")) for obj in lines(path)]
    assert sent and all(obj["body"]["response_format"]["type"] == "json_schema" for obj in sent)
    good, bad = sent[0]["custom_id"], sent[1]["custom_id"]
    answers = [openai_ok(o["custom_id"], ['{"n": 1}']) for o in sent if o["custom_id"] != bad]
    answers.append(openai_ok(bad, ['{"n": "one"}']))
    code, _, err = bulkrun("batch", "collect", out, write_lines(tmp_path / "r.jsonl", answers))
    assert code == EXIT_ROW_ERRORS, err
    by_id = {r["id"]: r for r in read_jsonl(out / "results.jsonl")}
    assert json.loads(by_id[good]["json"]) == {"n": 1}
    invalid = [e for e in read_jsonl(out / "errors.jsonl") if e["kind"] == "invalid_output"]
    assert [e["id"] for e in invalid] == [bad] and '"one"' in invalid[0]["message"]
