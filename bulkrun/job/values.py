"""Parsing and checking option values: types of spec keys, sizes, checkpoint intervals."""

from __future__ import annotations

import re
from typing import Any

from bulkrun.errors import UsageError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def check_value(key: str, value: Any, annotation: str, where: str) -> Any:
    """Check a spec value against its field annotation (e.g. "int | None", "list[str]")."""
    kinds = [part.strip() for part in str(annotation).split("|")]
    if "None" in kinds and value is None:
        return None
    if "bool" in kinds and isinstance(value, bool):
        return value
    if "int" in kinds and isinstance(value, int) and not isinstance(value, bool):
        return value
    if "float" in kinds and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if "str" in kinds and isinstance(value, str):
        return value
    if "str" in kinds and key in ("checkpoint_every", "kv_cache_mem") and isinstance(value, int):
        return str(value)  # a bare number of items / bytes
    if "list[str]" in kinds:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return list(value)
    wanted = " or ".join(k for k in kinds if k != "None")
    raise UsageError(f"option '{key}' in {where} must be {wanted}, got {value!r}")


def parse_size(text: str | int) -> int:
    """Bytes from "4GiB", "512MB", "2g" or a plain number."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and match[2].lower()
    if not match or unit not in _SIZE_UNITS:
        raise UsageError(f"invalid size {text!r} (use e.g. 4GiB, 512MiB or a number of bytes)")
    size = int(float(match[1]) * _SIZE_UNITS[unit])
    if size <= 0:
        raise UsageError(f"size must be positive, got {text!r}")
    return size


def parse_checkpoint(text: str | int) -> tuple[int | None, float | None]:
    """(items, seconds) from "500", "60s", "5m" or "500,60s": commit at whichever comes first."""
    items, seconds = None, None
    for part in str(text).split(","):
        part = part.strip().lower()
        if re.fullmatch(r"\d+", part):
            items = int(part)
        elif re.fullmatch(r"\d+(\.\d+)?[smh]", part):
            seconds = float(part[:-1]) * _DURATION_UNITS[part[-1]]
        else:
            raise UsageError(f"invalid --checkpoint-every {text!r} (use e.g. 500, 60s, or 500,60s)")
    if (items is not None and items < 1) or (seconds is not None and seconds <= 0):
        raise UsageError(f"--checkpoint-every must be positive, got {text!r}")
    return items, seconds
