"""Input formats: detection and streaming of JSONL, OpenAI batch JSONL, Parquet and CSV."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.rows import write_jsonl

from bulkrun.errors import InputError
from bulkrun.io.formats import CSV, JSONL, OPENAI, PARQUET, detect_format
from bulkrun.io.readers import count_rows, read_rows
from bulkrun.tasks.base import RowError


def _rows(path, fmt):
    return list(read_rows(path, fmt))


def test_jsonl_rows_use_line_numbers_and_skip_blank_lines(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "a"}\n\n{"text": "b"}\n   \n{"text": "c"}\n')
    assert detect_format(path) == JSONL
    assert _rows(path, JSONL) == [(0, {"text": "a"}), (2, {"text": "b"}), (4, {"text": "c"})]
    assert count_rows(path, JSONL) == 3


def test_jsonl_bad_lines_become_row_errors(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": \n[1, 2]\n{"text": "\xff\xfe"}\n')
    rows = _rows(path, JSONL)
    assert rows[0] == (0, {"text": "ok"})
    kinds = [(i, r.kind) for i, r in rows[1:]]
    assert kinds == [(1, "malformed_json"), (2, "malformed_json"), (3, "invalid_utf8")]
    assert all(isinstance(r, RowError) for _, r in rows[1:])


def test_openai_batch_is_detected_and_parsed(tmp_path):
    line = {
        "custom_id": "req-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
    }
    bad = dict(line, custom_id="req-2", body={"messages": "not a list"})
    path = write_jsonl(tmp_path / "batch.jsonl", [line, bad])
    assert detect_format(path) == OPENAI
    (i0, first), (i1, second) = _rows(path, OPENAI)
    assert first["custom_id"] == "req-1" and first["messages"] == [{"role": "user", "content": "Hi"}]
    assert isinstance(second, RowError) and second.kind == "invalid_request"


def test_parquet_streams_in_batches(tmp_path):
    path = tmp_path / "in.parquet"
    table = pa.table({"id": [f"x{i}" for i in range(3000)], "text": [f"t{i}" for i in range(3000)]})
    pq.write_table(table, path, row_group_size=700)
    assert detect_format(path) == PARQUET
    rows = _rows(path, PARQUET)
    assert len(rows) == 3000 and rows[2999] == (2999, {"id": "x2999", "text": "t2999"})
    assert count_rows(path, PARQUET) == 3000


def test_csv_reads_cells_as_text_and_keeps_invalid_utf8_per_cell(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b'id,text,n\n1,"hello, world",5\n2,\xff\xfebad,6\n3,"multi\nline",7\n')
    assert detect_format(path) == CSV
    rows = _rows(path, CSV)
    assert rows[0] == (0, {"id": "1", "text": "hello, world", "n": "5"})
    assert isinstance(rows[1][1]["text"], bytes)  # decoded lazily: an error only where it is used
    assert rows[2][1]["text"] == "multi\nline"
    assert count_rows(path, CSV) == 3


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.jsonl", None, "does not exist"),
        ("data.xyz", b"just words", "unknown format"),
        ("fake.parquet", b"not parquet at all", "not a Parquet file"),
    ],
)
def test_unreadable_inputs_are_input_errors(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        detect_format(path)


def test_a_directory_is_not_an_input(tmp_path):
    with pytest.raises(InputError, match="directory"):
        detect_format(tmp_path)


def test_unknown_extension_with_json_content_is_jsonl(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text(json.dumps({"text": "a"}) + "\n")
    assert detect_format(path) == JSONL
