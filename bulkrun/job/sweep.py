"""Running an eval sweep: one ordinary job per combination (bulkrun/tasks/sweep.py says which), then
the comparison tables.

Each combination has its own output directory OUT/runs/<name>/, so every run is resumable on its own
and rerunning the sweep continues where it stopped. The comparison goes to OUT/sweep.json (every
run's metrics) and OUT/sweep.md (a table). Runs of one model follow each other, so the loaded model
is reused between them (bulkrun.engine.worker.loaded_model keeps the last one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bulkrun.io.atomic import make_dirs, write_text_atomic
from bulkrun.job.spec import JobSpec
from bulkrun.tasks.sweep import (
    SWEEP_KEYS,
    Combination,
    SweepError,
    combinations,
    markdown_table,
    template_files,
)


def run_sweep(spec: JobSpec, run_one: Callable[[JobSpec], dict]) -> list[dict]:
    """Run every combination with `run_one(child_spec) -> report`, then write the tables."""
    has_labels = bool(spec.task_options.get("labels") or spec.task_options.get("labels_file"))
    combos = combinations(spec.task_options, has_labels, read_template_files(spec.task_options))
    rows = []
    for combo in combos:
        child = child_spec(spec, combo)
        rows.append(sweep_row(combo, child, run_one(child)))
    write_tables(Path(spec.out), rows)
    return rows


def read_template_files(task_options: dict) -> dict[Path, str]:
    texts = {}
    for path in template_files(task_options):
        try:
            texts[path] = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SweepError(f"sweep_template: cannot read {path}: {exc.strerror or exc}") from None
    return texts


def child_spec(spec: JobSpec, combo: Combination) -> JobSpec:
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


def sweep_row(combo: Combination, child: JobSpec, report: dict) -> dict:
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
    make_dirs(out)
    write_text_atomic(out / "sweep.json", json.dumps({"runs": list(rows)}, indent=2) + "\n")
    write_text_atomic(out / "sweep.md", markdown_table(rows))
