"""Import side: provider result files (built here in each provider's documented format) back into
result and error records shaped like a local run's."""

import json

import pytest
from helpers.provider_batch import (
    anthropic_errored,
    anthropic_ok,
    openai_error_line,
    openai_http_error,
    openai_ok,
    write_lines,
)

from bulkrun.io.provider_batch import (
    BatchError,
    BatchRequest,
    BatchSampling,
    ProviderBatchError,
    RowAssembler,
    SampleResult,
    load_export,
    read_results,
    write_batch,
)


def chat(text):
    return [{"role": "user", "content": text}]


ROWS = [BatchRequest(i, f"id-{i}", chat(f"q{i}")) for i in range(5)]


def export(tmp_path, provider, n=1):
    out = tmp_path / provider
    write_batch(ROWS, provider, "m", BatchSampling(max_tokens=8, n=n), out)
    batch, id_map = load_export(out)
    sent = [json.loads(line) for f in batch.files for line in (out / f.name).read_text().splitlines()]
    return batch, id_map, [obj["custom_id"] for obj in sent]


def assemble(outcomes, n=1, as_lists=False):
    assembler = RowAssembler(n, as_lists)
    done = [out for out in map(assembler.add, outcomes) if out is not None]
    return assembler, done


def test_openai_output_and_error_files(tmp_path):
    _, id_map, ids = export(tmp_path, "openai")
    output = write_lines(
        tmp_path / "out.jsonl",
        [
            openai_ok(ids[0], ["zero"]),
            openai_ok(ids[1], ["one"], "length"),
            openai_http_error(ids[2], 400, "invalid_request_error"),
        ],
    )
    errors = write_lines(
        tmp_path / "err.jsonl",
        [openai_error_line(ids[3], "batch_expired"), openai_http_error(ids[4], 500, "server_error")],
    )
    assembler, done = assemble(read_results([output, errors], id_map))
    assert done[0] == {
        "row": 0,
        "id": "id-0",
        "text": "zero",
        "finish_reason": "stop",
        "prompt_tokens": 7,
        "generated_tokens": 3,
    }
    assert done[1]["finish_reason"] == "length"
    assert isinstance(done[2], BatchError) and done[2].record() == {
        "row": 2,
        "id": "id-2",
        "kind": "invalid_request_error",
        "message": "openai: HTTP 400: bad thing",
    }
    assert len(done) == 3  # the expired and the server error leave their rows to the next run
    assert [(e.row, e.kind) for e in assembler.retryable] == [(3, "batch_expired"), (4, "server_error")]


def test_openai_n_samples_become_list_columns(tmp_path):
    _, id_map, ids = export(tmp_path, "openai", n=2)
    path = write_lines(tmp_path / "out.jsonl", [openai_ok(ids[0], ["a", "b"], completion=9)])
    _, [record] = assemble(read_results([path], id_map, n=2), n=2)
    assert record["text"] == ["a", "b"] and record["finish_reason"] == ["stop", "stop"]
    assert record["prompt_tokens"] == 7
    assert record["generated_tokens"] == [None, None]  # OpenAI gives one total for all choices


def test_openai_refusal_is_kept_as_text_with_its_reason(tmp_path):
    _, id_map, ids = export(tmp_path, "openai")
    line = openai_ok(ids[0], ["x"])
    line["response"]["body"]["choices"][0]["message"].update(content=None, refusal="I can't help with that")
    [result] = read_results([write_lines(tmp_path / "o.jsonl", [line])], id_map)
    assert (result.text, result.finish_reason) == ("I can't help with that", "refusal")


def test_anthropic_results_all_four_types(tmp_path):
    _, id_map, ids = export(tmp_path, "anthropic")
    path = write_lines(
        tmp_path / "results.jsonl",
        [
            anthropic_ok(ids[4], "four", "max_tokens"),
            anthropic_errored(ids[1], "invalid_request_error"),
            {"custom_id": ids[2], "result": {"type": "expired"}},
            {"custom_id": ids[3], "result": {"type": "canceled"}},
            anthropic_ok(ids[0], "zero", "stop_sequence"),
            anthropic_errored(ids[0], "overloaded_error"),  # row 0 already done: a duplicate
        ],
    )
    outcomes = list(read_results([path], id_map))
    assert isinstance(outcomes[0], SampleResult) and outcomes[0].prompt_tokens == 9  # input + cache read
    assembler, done = assemble(outcomes)
    assert done[0] == {
        "row": 4,
        "id": "id-4",
        "text": "four",
        "finish_reason": "length",
        "prompt_tokens": 9,
        "generated_tokens": 2,
    }
    assert done[1].record()["kind"] == "invalid_request_error" and not done[1].retryable
    assert done[2]["finish_reason"] == "stop"
    assert [(e.row, e.kind) for e in assembler.retryable] == [(2, "batch_expired"), (3, "batch_canceled")]
    assert assembler.duplicates == 1


def test_anthropic_samples_join_across_files_in_any_order(tmp_path):
    _, id_map, ids = export(tmp_path, "anthropic", n=3)
    row0 = [i for i in ids if i.startswith("id-0__")]
    row1 = [i for i in ids if i.startswith("id-1__")]
    first = write_lines(tmp_path / "a.jsonl", [anthropic_ok(row0[2], "c"), anthropic_ok(row1[0], "x")])
    second = write_lines(
        tmp_path / "b.jsonl",
        [
            anthropic_ok(row0[0], "a"),
            anthropic_ok(row0[1], "b"),
            {"custom_id": row1[1], "result": {"type": "expired"}},
        ],
    )
    assembler, done = assemble(read_results([first, second], id_map, n=3), n=3)
    assert [r["text"] for r in done] == [["a", "b", "c"]]
    assert done[0]["generated_tokens"] == [2, 2, 2]
    assert assembler.incomplete_rows() == [1]  # one sample in, one expired: the row waits for a rerun


def test_a_file_read_twice_adds_nothing(tmp_path):
    _, id_map, ids = export(tmp_path, "openai")
    path = write_lines(tmp_path / "out.jsonl", [openai_ok(c, [c]) for c in ids])
    assembler, done = assemble(read_results([path, path], id_map))
    assert [r["row"] for r in done] == [0, 1, 2, 3, 4] and assembler.duplicates == 5


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_unknown_custom_id_is_an_error_naming_it(tmp_path, provider):
    _, id_map, _ = export(tmp_path, provider)
    line = openai_ok("stranger", ["?"]) if provider == "openai" else anthropic_ok("stranger", "?")
    path = write_lines(tmp_path / "out.jsonl", [line])
    with pytest.raises(ProviderBatchError, match=r"out.jsonl:1: result for unknown custom_id 'stranger'"):
        list(read_results([path], id_map))


@pytest.mark.parametrize(
    "text, detail",
    [
        ("{not json", "not a provider batch result line"),
        ('{"custom_id": "id-0"}', "missing field 'response'"),
        ('{"custom_id": "id-0", "result": {"type": "vanished"}}', "unknown result type 'vanished'"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_a_broken_result_line_names_file_and_line(tmp_path, text, detail):
    _, id_map, _ = export(tmp_path, "openai")
    path = tmp_path / "bad.jsonl"
    path.write_text("\n" + text + "\n")
    with pytest.raises(ProviderBatchError, match=f"bad.jsonl:2: .*{detail}"):
        list(read_results([path], id_map))


def test_more_choices_than_exported_is_refused(tmp_path):
    _, id_map, ids = export(tmp_path, "openai")
    path = write_lines(tmp_path / "out.jsonl", [openai_ok(ids[0], ["a", "b"])])
    with pytest.raises(ProviderBatchError, match="n=1"):
        list(read_results([path], id_map))


def test_missing_export_files_are_clear_errors(tmp_path):
    with pytest.raises(ProviderBatchError, match="not a readable batch export"):
        load_export(tmp_path)
    _, id_map, _ = export(tmp_path, "openai")
    with pytest.raises(ProviderBatchError, match="cannot read the result file"):
        list(read_results([tmp_path / "absent.jsonl"], id_map))


@pytest.mark.parametrize("n", [1, 2])
def test_records_have_a_local_runs_columns(tmp_path, n):
    from bulkrun.engine.core.outputs import RequestOutput
    from bulkrun.tasks.base import generation_columns

    local = generation_columns([RequestOutput(str(k), [1, 2], [3], "t", "stop") for k in range(n)], n)
    _, id_map, ids = export(tmp_path, "anthropic", n=n)
    path = write_lines(tmp_path / "r.jsonl", [anthropic_ok(c, "t") for c in ids if c.startswith("id-0")])
    _, [record] = assemble(read_results([path], id_map, n=n), n=n)
    assert list(record) == ["row", "id", *local]
    assert [type(record[k]) for k in local] == [type(v) for v in local.values()]
