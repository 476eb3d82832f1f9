"""Running a sweep: one job per combination into its own directory, runs of one model in a row,
`@file` templates read here, and the tables written."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from bulkrun.job.sweep import run_sweep
from bulkrun.tasks.sweep import SweepError


@dataclass
class Spec:  # the JobSpec fields a sweep touches
    out: str
    model: str | None = None
    prompt_template: str | None = None
    temperature: float = 0.0
    task_options: dict = field(default_factory=dict)


def test_run_sweep_runs_each_combination_into_its_own_dir_and_writes_tables(tmp_path):
    spec = Spec(
        out=str(tmp_path / "sweep"),
        task_options={"sweep_model": ["a", "b"], "sweep_temperature": [0, 1], "answer_regex": "x"},
    )
    calls = []

    def run_one(child):
        calls.append((child.out, child.model, child.temperature, dict(child.task_options)))
        metrics = {"kind": "generation", "items": 10, "accuracy": 0.1 * len(calls)}
        out = tmp_path / child.out
        out.mkdir(parents=True)
        (out / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
        return {"items": 10, "errors": 0, "items_per_s": 2.5}

    rows = run_sweep(spec, run_one)
    # a model's runs follow each other, so the loaded model serves both temperatures
    assert [c[1:3] for c in calls] == [("a", 0.0), ("a", 1.0), ("b", 0.0), ("b", 1.0)]
    assert calls[0][0] == str(tmp_path / "sweep" / "runs" / "m1-a__temp0")
    assert all(c[3] == {"answer_regex": "x"} for c in calls)  # sweep keys are not passed on
    assert [r["accuracy"] for r in rows] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    saved = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [r["name"] for r in saved["runs"]] == [r["name"] for r in rows]
    table = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "| m2-b__temp1 | b | (default) | 1 | 10 | 0 | 40.0% | - | - | - | 2.50 |" in table


def test_template_files_are_read_and_a_missing_one_is_refused(tmp_path):
    template = tmp_path / "terse.txt"
    template.write_text("Q: {question}\nA:", encoding="utf-8")
    spec = Spec(out=str(tmp_path / "sweep"), task_options={"sweep_template": ["{question}", f"@{template}"]})
    seen = []
    run_sweep(spec, lambda child: seen.append(child.prompt_template) or {})
    assert seen == ["{question}", "Q: {question}\nA:"]
    assert "| t2 | (default) | terse.txt |" in (tmp_path / "sweep" / "sweep.md").read_text()
    spec.task_options = {"sweep_template": [f"@{tmp_path / 'missing'}"]}
    with pytest.raises(SweepError, match="cannot read"):
        run_sweep(spec, lambda child: {})
