"""Stream the rows of an input file with bounded memory.

Each reader yields (row_index, fields) where fields is a dict, or a RowError for a row that cannot be
parsed (malformed JSON, invalid UTF-8, not an object, a broken OpenAI request). Row indices are
stable across runs: JSONL uses the 0-based line number (blank lines are skipped, not rows), Parquet
and CSV the 0-based record number.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from itertools import islice
from pathlib import Path

from bulkrun.errors import InputError, RowError, UsageError
from bulkrun.io.formats import CSV, JSONL, OPENAI, PARQUET
from bulkrun.io.openai_batch import parse_request

BATCH_ROWS = 1024  # Parquet/CSV record batch size: memory stays bounded whatever the file size

Row = tuple[int, "dict | RowError"]


def read_rows(path: Path, fmt: str) -> Iterator[Row]:
    readers = {JSONL: read_jsonl, OPENAI: read_openai, PARQUET: read_parquet, CSV: read_csv}
    return readers[fmt](path)


def read_jsonl(path: Path) -> Iterator[Row]:
    with open(path, "rb") as f:
        for index, raw in enumerate(f):
            if not raw.strip():
                continue
            yield index, _parse_json_object(raw)


def _parse_json_object(raw: bytes) -> dict | RowError:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RowError("invalid_utf8", f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})")
    try:
        obj = json.loads(line)
    except ValueError as exc:
        return RowError("malformed_json", f"malformed JSON: {exc}")
    if not isinstance(obj, dict):
        return RowError("malformed_json", f"a line must be a JSON object, got {type(obj).__name__}")
    return obj


def read_openai(path: Path) -> Iterator[Row]:
    for index, obj in read_jsonl(path):
        if isinstance(obj, RowError):
            yield index, obj
            continue
        try:
            yield index, parse_request(obj)
        except RowError as exc:
            yield index, exc


def read_parquet(path: Path) -> Iterator[Row]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a broken file
        raise InputError(f"input '{path}' is not a readable Parquet file: {exc}") from None
    index = 0
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
        for fields in batch.to_pylist():
            yield index, fields
            index += 1


def read_csv(path: Path) -> Iterator[Row]:
    """CSV cells are read as bytes and decoded per cell, so one invalid UTF-8 cell spoils one row
    (an error record when that cell is used), not the whole stream."""
    index = 0
    for batch in _csv_batches(path):
        for cells in batch.to_pylist():
            yield index, {name: _decode_cell(value) for name, value in cells.items()}
            index += 1


def _csv_batches(path: Path):
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = csv_column_names(path)
    convert = pcsv.ConvertOptions(column_types={name: pa.binary() for name in names})
    read = pcsv.ReadOptions(block_size=1 << 20, use_threads=False)
    try:
        reader = pcsv.open_csv(path, read_options=read, convert_options=convert)
    except pa.ArrowInvalid as exc:
        raise InputError(f"input '{path}' is not a readable CSV file: {exc}") from None
    done = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except pa.ArrowInvalid as exc:
            raise InputError(f"input '{path}': CSV broken after record {done}: {exc}") from None
        done += batch.num_rows
        yield batch


def csv_column_names(path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    try:
        reader = pcsv.open_csv(
            path,
            read_options=pcsv.ReadOptions(block_size=1 << 16, use_threads=False),
            convert_options=pcsv.ConvertOptions(check_utf8=False),
        )
    except pa.ArrowInvalid as exc:
        raise InputError(f"input '{path}' is not a readable CSV file: {exc}") from None
    return list(reader.schema.names)


def _decode_cell(value: bytes | None) -> str | bytes | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value  # kept as bytes: text_field()/fill_template() turn it into an invalid_utf8 row


def count_rows(path: Path, fmt: str) -> int:
    """Number of rows, for progress and status; a cheap pass (Parquet: metadata only)."""
    if fmt == PARQUET:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if fmt == CSV:
        return sum(batch.num_rows for batch in _csv_batches(path))
    with open(path, "rb") as f:
        return sum(1 for raw in f if raw.strip())


def check_columns(path: Path, fmt: str, named: Mapping[str, str], window: int) -> None:
    """Stop before any work when a field an option names (field -> option) is not in the input: not a
    column of a Parquet/CSV file, or in no row of a JSONL file's first `window` rows. A typo in a
    field name would otherwise cost the whole job in error records."""
    if not named:
        return
    if fmt in (PARQUET, CSV):
        columns = list(_parquet_columns(path) if fmt == PARQUET else csv_column_names(path))
        where = "is not a column of"
    else:
        rows = [fields for _, fields in islice(read_rows(path, fmt), window) if isinstance(fields, dict)]
        if not rows:
            return  # nothing to judge by: bad rows become error records as usual
        columns = list(dict.fromkeys(key for fields in rows for key in fields))
        where = f"is in none of the first {len(rows)} rows of"
    for field, option in named.items():
        if field not in columns:
            raise UsageError(
                f"{option} '{field}' {where} input '{path}' (its fields: {', '.join(columns) or 'none'})"
            )


def _parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(path).names)
    except Exception as exc:  # pyarrow raises several types for a broken file
        raise InputError(f"input '{path}' is not a readable Parquet file: {exc}") from None
