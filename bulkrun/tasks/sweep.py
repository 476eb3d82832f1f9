"""Eval sweeps: one run per combination of models, prompt templates and temperatures, then a table.

Each combination is an ordinary job with its own output directory OUT/runs/<name>/, so every run is
resumable on its own and rerunning the sweep continues where it stopped. The comparison goes to
OUT/sweep.json (every run's metrics) and OUT/sweep.md (a table). A model is loaded once for all
the combinations that use it, when the job layer's runner accepts an already loaded engine.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

SWEEP_KEYS = ("sweep_model", "sweep_template", "sweep_temperature")


class SweepError(ValueError):
    """A sweep that cannot run as given; the message says why."""


@dataclass(frozen=True)
class Combination:
    name: str
    model: str | None
    template: str | None
    temperature: float | None
    template_label: str | None = None  # short text for the table (a file name or the start of it)


def is_sweep(task_options: dict) -> bool:
    return any(task_options.get(key) for key in SWEEP_KEYS)


def combinations(task_options: dict, has_labels: bool) -> list[Combination]:
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
        text, label = _template(template)
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


def _template(value: str | None) -> tuple[str | None, str | None]:
    """A template given inline, or `@path` read from a file."""
    if value is None:
        return None, None
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            return path.read_text(encoding="utf-8"), path.name
        except OSError as exc:
            raise SweepError(f"sweep_template: cannot read {path}: {exc.strerror or exc}") from None
    short = " ".join(value.split())
    return value, short if len(short) <= 40 else short[:37] + "..."


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "model"


def child_spec(spec, combo: Combination):
    """The job spec of one combination: the sweep's spec with this combination's values."""
    options = {k: v for k, v in spec.task_options.items() if k not in SWEEP_KEYS}
    changes: dict[str, Any] = {"out": str(Path(spec.out) / "runs" / combo.name), "task_options": options}
    if combo.model is not None:
        changes["model"] = combo.model
    if combo.template is not None:
        changes["prompt_template"] = combo.template
    if combo.temperature is not None:
        changes["temperature"] = combo.temperature
    return replace(spec, **changes)


def run_sweep(
    spec,
    run_one: Callable[..., dict],
    build_engine: Callable[[Any], Any] | None = None,
    has_labels: bool = False,
) -> list[dict]:
    """Run every combination (grouped by model so each model loads once), then write the tables.
    `run_one(child_spec, engine=...)` runs one job and returns its report dict."""
    combos = combinations(spec.task_options, has_labels)
    rows: list[dict] = []
    for _model, group in itertools.groupby(combos, key=lambda c: c.model):
        group = list(group)
        first = child_spec(spec, group[0])
        engine = build_engine(first) if build_engine is not None and len(group) > 1 else None
        for combo in group:
            child = child_spec(spec, combo)
            report = run_one(child, engine=engine) if engine is not None else run_one(child)
            rows.append(sweep_row(combo, child, report))
    write_tables(Path(spec.out), rows)
    return rows


def sweep_row(combo: Combination, child, report: dict) -> dict:
    metrics_path = Path(child.out) / "metrics.json"
    metrics = json.loads(metrics_path.read_text(encoding="utf-8")) if metrics_path.exists() else {}
    return {
        "name": combo.name,
        "out": child.out,
        "model": child.model,
        "prompt_template": combo.template_label,
        "temperature": child.temperature if combo.temperature is not None else None,
        "items": metrics.get("items"),
        "errors": report.get("errors"),
        "accuracy": metrics.get("accuracy"),  # multiple choice: acc
        "acc_norm": metrics.get("acc_norm"),  # multiple choice
        "raw_accuracy": metrics.get("raw_accuracy"),  # calibrated labels: the accuracy without
        "macro_f1": metrics.get("macro_f1"),
        "items_per_s": report.get("items_per_s"),
        "metrics": metrics,
    }


def write_tables(out: Path, rows: Sequence[dict]) -> None:
    from bulkrun.io.atomic import write_text_atomic

    write_text_atomic(out / "sweep.json", json.dumps({"runs": list(rows)}, indent=2) + "\n")
    write_text_atomic(out / "sweep.md", markdown_table(rows))


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
