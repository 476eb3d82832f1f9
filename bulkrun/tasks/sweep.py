"""Eval sweeps, the pure part: which combinations of models, prompt templates and temperatures a
sweep's options name, and the comparison table. Running them (one ordinary job per combination) and
writing the tables is the job layer's (bulkrun/job/sweep.py).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bulkrun.exceptions import UsageError

SWEEP_KEYS = ("sweep_model", "sweep_template", "sweep_temperature")


class SweepError(UsageError):
    """A sweep that cannot run as given; the message says why (a bad option: exit code 2)."""


@dataclass(frozen=True)
class Combination:
    name: str
    model: str | None
    template: str | None
    temperature: float | None
    template_label: str | None = None  # short text for the table (a file name or the start of it)


def is_sweep(task_options: dict) -> bool:
    return any(task_options.get(key) for key in SWEEP_KEYS)


def template_files(task_options: dict) -> list[Path]:
    """The files the sweep's `@path` templates name (the job layer reads them)."""
    templates = _as_list(task_options.get("sweep_template"), "sweep_template", split=False)
    return [Path(t[1:]) for t in templates if t.startswith("@")]


def combinations(
    task_options: dict, has_labels: bool, files: Mapping[Path, str] | None = None
) -> list[Combination]:
    """Every combination, models outermost (so runs of one model follow each other). `files` holds
    the text of each `@path` template (template_files)."""
    models = _as_list(task_options.get("sweep_model"), "sweep_model")
    templates = _as_list(task_options.get("sweep_template"), "sweep_template", split=False)
    temperatures = [
        _temperature(t) for t in _as_list(task_options.get("sweep_temperature"), "sweep_temperature")
    ]
    if temperatures and has_labels:
        raise SweepError(
            "sweep_temperature has no effect on a suite with labels (labels are scored, not sampled)"
        )
    result = []
    for (mi, model), (ti, template), temp in itertools.product(
        _indexed(models), _indexed(templates), temperatures or [None]
    ):
        parts = []
        if model is not None:
            parts.append(f"m{mi}-{_slug(Path(model).stem or model)}")
        if template is not None:
            parts.append(f"t{ti}")
        if temp is not None:
            parts.append(f"temp{temp:g}")
        text, label = _template(template, files or {})
        result.append(Combination("__".join(parts) or "base", model, text, temp, label))
    return result


def _as_list(value, key: str, split: bool = True) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")] if split else [value]
    if not isinstance(value, (list, tuple)):
        raise SweepError(f"{key} must be a list, got {type(value).__name__}")
    if any(v == "" for v in value):
        raise SweepError(f"{key} has an empty entry")
    if len(set(map(str, value))) != len(value):
        raise SweepError(f"{key} lists the same value twice")
    return list(value)


def _indexed(values: list) -> list[tuple[int, Any]]:
    return list(enumerate(values, start=1)) if values else [(0, None)]


def _temperature(value) -> float:
    try:
        temp = float(value)
    except (TypeError, ValueError):
        raise SweepError(f"sweep_temperature: {value!r} is not a number") from None
    if temp < 0:
        raise SweepError(f"sweep_temperature: {temp} is negative")
    return temp


def _template(value: str | None, files: Mapping[Path, str]) -> tuple[str | None, str | None]:
    """A template given inline, or `@path`: that file's text."""
    if value is None:
        return None, None
    if value.startswith("@"):
        path = Path(value[1:])
        return files[path], path.name
    short = " ".join(value.split())
    return value, short if len(short) <= 40 else short[:37] + "..."


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "model"


def markdown_table(rows: Sequence[dict]) -> str:
    columns = [
        "run",
        "model",
        "template",
        "temperature",
        "items",
        "errors",
        "accuracy",
        "acc_norm",
        "uncalibrated",
        "macro F1",
        "items/s",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [
            r["name"],
            r["model"] or "(default)",
            (r["prompt_template"] or "(default)").replace("|", "\\|"),
            "-" if r["temperature"] is None else f"{r['temperature']:g}",
            _cell(r["items"]),
            _cell(r["errors"]),
            _pct(r["accuracy"]),
            _pct(r.get("acc_norm")),
            _pct(r.get("raw_accuracy")),
            _pct(r["macro_f1"]),
            "-" if r["items_per_s"] is None else f"{r['items_per_s']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    return "-" if value is None else str(value)


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"
