"""Which input format a file is: JSONL, OpenAI batch JSONL, Parquet or CSV.

By extension first, then by content. OpenAI batch files are JSONL whose first non-blank line is an
object with custom_id and body (and usually method/url): they are detected, never declared.
"""

from __future__ import annotations

import json
from pathlib import Path

from bulkrun.exceptions import InputError

JSONL, OPENAI, PARQUET, CSV = "jsonl", "openai", "parquet", "csv"
FORMATS = (JSONL, OPENAI, PARQUET, CSV)
_EXTENSIONS = {
    ".jsonl": JSONL,
    ".ndjson": JSONL,
    ".json": JSONL,
    ".parquet": PARQUET,
    ".pq": PARQUET,
    ".csv": CSV,
}


def check_readable(path: Path) -> None:
    if not path.exists():
        raise InputError(f"input '{path}' does not exist")
    if path.is_dir():
        raise InputError(f"input '{path}' is a directory, not a file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise InputError(f"input '{path}' cannot be read: {exc.strerror or exc}") from None


def detect_format(path: Path) -> str:
    """The format of `path`; InputError if it is unreadable or of no known format."""
    check_readable(path)
    with open(path, "rb") as f:
        head = f.read(4)
    kind = _EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        kind = PARQUET if head == b"PAR1" else JSONL if head.lstrip()[:1] == b"{" else None
    if kind is None:
        raise InputError(
            f"input '{path}': unknown format (use a .jsonl, .parquet or .csv file; "
            "OpenAI batch files are .jsonl)"
        )
    if kind == PARQUET and head != b"PAR1":
        raise InputError(f"input '{path}' is not a Parquet file (no PAR1 header)")
    if kind == JSONL and _first_line_is_openai(path):
        return OPENAI
    return kind


def _first_line_is_openai(path: Path) -> bool:
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                return False
            return isinstance(obj, dict) and "custom_id" in obj and isinstance(obj.get("body"), dict)
    return False
