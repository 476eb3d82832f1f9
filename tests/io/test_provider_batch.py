"""Export side: request files in each provider's documented shape, split at its limits, ids mapped."""

import subprocess
import sys

import pytest
from helpers.provider_batch import ANTHROPIC_ID, check_anthropic_entry, check_openai_line, lines

from bulkrun.io.provider_batch import (
    BatchExport,
    BatchRequest,
    BatchSampling,
    ExportExists,
    ResponseFormat,
    UnsupportedOption,
    anthropic,
    load_export,
    openai,
    write_batch,
)
from bulkrun.io.provider_batch.custom_ids import MAP_FILE, base_custom_id
from bulkrun.io.provider_batch.writer import SplitWriter


def chat(text, system=None):
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": text}]


ROWS = [
    BatchRequest(0, "t-1", chat("hello", system="be brief")),
    BatchRequest(1, "with space", chat("hi")),
    BatchRequest(2, "row-9", chat("reserved-looking id")),
    BatchRequest(3, "x" * 80, chat("long id")),
]


def test_openai_request_lines_carry_the_job_options(tmp_path):
    fmt = ResponseFormat(
        "json_schema", {"type": "object", "properties": {"a": {"type": "integer"}}}, name="answer"
    )
    sampling = BatchSampling(
        max_tokens=32, temperature=0.7, top_p=0.9, seed=5, stop=("\n\n",), n=2, response_format=fmt
    )
    export = write_batch(ROWS, "openai", "gpt-4o-mini", sampling, tmp_path)
    assert (export.rows, export.requests, export.refused, export.per_sample) == (4, 4, 0, False)
    [batch_file] = export.files
    out = lines(tmp_path / batch_file.name)
    for obj in out:
        check_openai_line(obj)
    body = out[0]["body"]
    assert body["messages"] == chat("hello", system="be brief")
    assert (body["max_completion_tokens"], body["temperature"], body["top_p"], body["seed"]) == (
        32,
        0.7,
        0.9,
        5,
    )
    assert body["stop"] == ["\n\n"] and body["n"] == 2
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": fmt.schema, "strict": True},
    }
    assert batch_file.bytes == (tmp_path / batch_file.name).stat().st_size - 1  # no newline after the last


def test_openai_leaves_defaults_out_and_refuses_what_it_cannot_do(tmp_path):
    write_batch(ROWS[:1], "openai", "m", BatchSampling(max_tokens=8), tmp_path)
    body = lines(tmp_path / "openai-00001.jsonl")[0]["body"]
    assert set(body) == {"model", "messages", "max_completion_tokens", "temperature"}
    assert body["temperature"] == 0.0  # greedy jobs stay greedy: OpenAI's default is 1
    for bad in (
        BatchSampling(8, top_k=5),
        BatchSampling(8, min_p=0.1),
        BatchSampling(8, temperature=2.5),
        BatchSampling(8, stop=tuple("abcde")),
    ):
        with pytest.raises(UnsupportedOption):
            write_batch(ROWS, "openai", "m", bad, tmp_path / "no")
    assert not (tmp_path / "no").exists()  # refused before any file


def test_anthropic_entries_move_the_system_prompt_and_split_samples(tmp_path):
    sampling = BatchSampling(max_tokens=16, temperature=0.5, top_k=40, stop=("END",), n=3, seed=1)
    export = write_batch(ROWS, "anthropic", "claude-haiku-4-5", sampling, tmp_path)
    assert export.per_sample and (export.rows, export.requests) == (4, 12)
    out = lines(tmp_path / export.files[0].name)
    for obj in out:
        check_anthropic_entry(obj)
    first = out[0]["params"]
    assert first["system"] == "be brief" and first["messages"] == [{"role": "user", "content": "hello"}]
    assert (first["temperature"], first["top_k"], first["stop_sequences"]) == (0.5, 40, ["END"])
    assert [o["custom_id"] for o in out[:3]] == ["t-1__s0", "t-1__s1", "t-1__s2"]
    assert len({o["custom_id"] for o in out}) == 12


def test_anthropic_structured_output_and_refusals(tmp_path):
    schema = {"type": "object", "properties": {"label": {"enum": ["a", "b"]}}, "required": ["label"]}
    sampling = BatchSampling(max_tokens=16, response_format=ResponseFormat("json_schema", schema))
    refused = []
    rows = [
        *ROWS[:1],
        BatchRequest(5, "sys-only", [{"role": "system", "content": "x"}]),
        BatchRequest(6, "tool", [{"role": "tool", "content": "x"}]),
    ]
    export = write_batch(rows, "anthropic", "m", sampling, tmp_path, on_refused=refused.append)
    entry = lines(tmp_path / export.files[0].name)[0]
    assert entry["params"]["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert [(e.row, e.id, e.kind) for e in refused] == [
        (5, "sys-only", "invalid_request"),
        (6, "tool", "unsupported_message"),
    ]
    assert export.refused == 2 and export.requests == 1
    with pytest.raises(UnsupportedOption, match="json_object"):
        write_batch(
            ROWS, "anthropic", "m", BatchSampling(8, response_format=ResponseFormat("json_object")), tmp_path
        )
    with pytest.raises(UnsupportedOption, match="0..1"):
        write_batch(ROWS, "anthropic", "m", BatchSampling(8, temperature=1.5), tmp_path)


def test_custom_ids_are_valid_unique_and_recorded(tmp_path):
    export = write_batch(ROWS, "anthropic", "m", BatchSampling(max_tokens=4, n=1), tmp_path)
    ids = [o["custom_id"] for o in lines(tmp_path / export.files[0].name)]
    assert ids == ["t-1", "row-1", "row-2", "row-3"]  # own id when valid, else the row number
    loaded, id_map = load_export(tmp_path)
    assert loaded == export
    assert [id_map.resolve(c) for c in ids] == [(r.row, r.id, 0) for r in ROWS]
    assert id_map.resolve("row-7") is None and id_map.resolve("t-1__s0") is None
    assert len(lines(tmp_path / MAP_FILE)) == 4


@pytest.mark.parametrize("item_id", ["a", "a__s1", "row-12", "é", "x" * 64, "x" * 61, "-", "_r5"])
def test_per_sample_ids_round_trip(tmp_path, item_id):
    rows = [
        BatchRequest(0, item_id, chat("q")),
        BatchRequest(1, "a", chat("q")),
        BatchRequest(12, "b", chat("q")),
    ]
    rows = [r for i, r in enumerate(rows) if i == 0 or r.id != item_id]
    export = write_batch(rows, "anthropic", "m", BatchSampling(max_tokens=4, n=11), tmp_path)
    _, id_map = load_export(tmp_path)
    seen = set()
    for obj in lines(tmp_path / export.files[0].name):
        assert ANTHROPIC_ID.match(obj["custom_id"])
        seen.add(id_map.resolve(obj["custom_id"]))
    assert seen == {(r.row, r.id, k) for r in rows for k in range(11)}


def test_reserved_and_invalid_ids_fall_back_to_the_row():
    assert base_custom_id("row-3", 8) == "row-8"
    assert base_custom_id("ok_id-1", 8) == "ok_id-1"
    assert base_custom_id("a.b", 8) == "row-8"
    assert base_custom_id("x" * 62, 8, reserve=4) == "row-8"


def test_split_writer_keeps_every_file_within_both_limits(tmp_path):
    writer = SplitWriter(tmp_path, "p", max_requests=3, max_bytes=40, overhead=15)
    payloads = [b"x" * size for size in (10, 10, 10, 10, 20, 5, 5, 5, 5, 24)]
    for line in payloads:
        writer.add(line)
    files = writer.close()
    assert [f.requests for f in files] == [2, 2, 1, 3, 1, 1]
    for f in files:
        data = (tmp_path / f.name).read_bytes()
        assert f.requests <= 3 and f.bytes <= 40
        assert f.bytes == 15 + len(data) - 1  # the wrapping overhead + lines + separators
    joined = b"".join((tmp_path / f.name).read_bytes() for f in files)
    assert joined == b"".join(p + b"\n" for p in payloads)


def test_provider_limits_split_the_export(tmp_path, monkeypatch):
    monkeypatch.setattr(openai, "MAX_REQUESTS", 3)
    rows = [BatchRequest(i, f"r{i}", chat("same")) for i in range(8)]
    export = write_batch(rows, "openai", "m", BatchSampling(max_tokens=4), tmp_path)
    assert [f.requests for f in export.files] == [3, 3, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "batch.json",
        MAP_FILE,
        "openai-00001.jsonl",
        "openai-00002.jsonl",
        "openai-00003.jsonl",
    ]
    one = len((tmp_path / "openai-00001.jsonl").read_bytes().splitlines()[0])
    monkeypatch.setattr(anthropic, "MAX_BYTES", anthropic.FILE_OVERHEAD_BYTES + 2 * one + 40)
    export = write_batch(rows, "anthropic", "m", BatchSampling(max_tokens=4), tmp_path / "a")
    assert all(f.bytes <= anthropic.MAX_BYTES for f in export.files) and len(export.files) > 1
    assert sum(f.requests for f in export.files) == 8


def test_a_request_over_the_byte_limit_is_an_error_record(tmp_path, monkeypatch):
    monkeypatch.setattr(openai, "MAX_BYTES", 300)
    refused = []
    rows = [BatchRequest(0, "small", chat("hi")), BatchRequest(1, "big", chat("y" * 400))]
    export = write_batch(
        rows, "openai", "m", BatchSampling(max_tokens=4), tmp_path, on_refused=refused.append
    )
    assert [(e.id, e.kind) for e in refused] == [("big", "request_too_large")]
    assert export.requests == 1


def test_documented_limits():
    assert (openai.MAX_REQUESTS, openai.MAX_BYTES) == (50_000, 200_000_000)
    assert (anthropic.MAX_REQUESTS, anthropic.MAX_BYTES) == (100_000, 256_000_000)


def test_the_real_request_limit_splits_a_large_export(tmp_path):
    rows = (
        BatchRequest(i, str(i), [{"role": "user", "content": "q"}]) for i in range(openai.MAX_REQUESTS + 1)
    )
    export = write_batch(rows, "openai", "m", BatchSampling(max_tokens=1), tmp_path)
    assert [f.requests for f in export.files] == [openai.MAX_REQUESTS, 1]
    assert BatchExport.load(tmp_path).files == export.files


def test_an_earlier_export_is_refused_or_replaced_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(openai, "MAX_REQUESTS", 2)
    rows = [BatchRequest(i, f"r{i}", chat("q")) for i in range(5)]
    write_batch(rows, "openai", "m", BatchSampling(max_tokens=4), tmp_path)
    with pytest.raises(ExportExists, match="already holds a batch export"):
        write_batch(rows[:1], "anthropic", "m", BatchSampling(max_tokens=4), tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    export = write_batch(rows[:1], "anthropic", "m", BatchSampling(max_tokens=4), tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "anthropic-00001.jsonl",
        "batch.json",
        MAP_FILE,
        "notes.txt",
    ]
    assert export.rows == 1


def test_a_failed_export_leaves_no_files_that_look_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(openai, "MAX_REQUESTS", 2)

    def rows():
        for i in range(5):
            yield BatchRequest(i, f"r{i}", chat("q"))
        raise OSError("input vanished")

    with pytest.raises(OSError, match="vanished"):
        write_batch(rows(), "openai", "m", BatchSampling(max_tokens=4), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_rows_own_sampling_is_checked_row_by_row(tmp_path):
    refused = []
    rows = [
        BatchRequest(0, "own", chat("q"), BatchSampling(max_tokens=99, temperature=0.3)),
        BatchRequest(1, "too-hot", chat("q"), BatchSampling(max_tokens=8, temperature=1.5)),
        BatchRequest(2, "two", chat("q"), BatchSampling(max_tokens=8, n=2)),
    ]
    write_batch(rows, "anthropic", "m", BatchSampling(max_tokens=8), tmp_path, on_refused=refused.append)
    [entry] = lines(tmp_path / "anthropic-00001.jsonl")
    assert (entry["params"]["max_tokens"], entry["params"]["temperature"]) == (99, 0.3)
    assert [(e.id, e.kind) for e in refused] == [
        ("too-hot", "unsupported_option"),
        ("two", "invalid_request"),
    ]


def test_the_package_needs_no_torch():
    code = "import sys, bulkrun.io.provider_batch; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
