"""Sweep logic: combinations, one output directory per run, a model loaded once, and the tables."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from bulkrun.tasks.sweep import SweepError, combinations, is_sweep, markdown_table, run_sweep


@dataclass
class Spec:  # the JobSpec fields a sweep touches
    out: str
    model: str | None = None
    prompt_template: str | None = None
    temperature: float = 0.0
    task_options: dict = field(default_factory=dict)


def test_combinations_name_every_swept_dimension(tmp_path):
    template_file = tmp_path / "terse.txt"
    template_file.write_text("Q: {question}\nA:", encoding="utf-8")
    combos = combinations(
        {
            "sweep_model": "models/a.gguf,/x/b",
            "sweep_template": ["Answer: {question}", f"@{template_file}"],
            "sweep_temperature": [0, 0.7],
        },
        has_labels=False,
    )
    assert len(combos) == 8
    assert combos[0].name == "m1-a__t1__temp0" and combos[-1].name == "m2-b__t2__temp0.7"
    assert len({c.name for c in combos}) == 8
    assert combos[-1].template == "Q: {question}\nA:" and combos[-1].template_label == "terse.txt"
    assert combinations({"sweep_temperature": "0.5"}, False)[0].name == "temp0.5"


def test_bad_sweeps_are_refused(tmp_path):
    with pytest.raises(SweepError, match="no effect on a suite with labels"):
        combinations({"sweep_temperature": [0.5]}, has_labels=True)
    with pytest.raises(SweepError, match="same value twice"):
        combinations({"sweep_model": "a,a"}, False)
    with pytest.raises(SweepError, match="not a number"):
        combinations({"sweep_temperature": "hot"}, False)
    with pytest.raises(SweepError, match="cannot read"):
        combinations({"sweep_template": f"@{tmp_path / 'missing'}"}, False)
    assert not is_sweep({"sweep_model": None}) and is_sweep({"sweep_model": ["a"]})


def test_run_sweep_runs_each_combination_into_its_own_dir_and_writes_tables(tmp_path):
    spec = Spec(
        out=str(tmp_path / "sweep"),
        task_options={"sweep_model": ["a", "b"], "sweep_temperature": [0, 1], "answer_regex": "x"},
    )
    calls, built = [], []

    def build_engine(child):
        built.append(child.model)
        return f"engine-{child.model}"

    def run_one(child, engine=None):
        calls.append((child.out, child.model, child.temperature, engine, dict(child.task_options)))
        metrics = {"kind": "generation", "items": 10, "accuracy": 0.1 * len(calls)}
        out = tmp_path / child.out
        out.mkdir(parents=True)
        (out / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
        return {"items": 10, "errors": 0, "items_per_s": 2.5}

    rows = run_sweep(spec, run_one, build_engine)
    assert built == ["a", "b"]  # one engine per model, shared by its two temperatures
    assert [c[1:4] for c in calls] == [
        ("a", 0.0, "engine-a"),
        ("a", 1.0, "engine-a"),
        ("b", 0.0, "engine-b"),
        ("b", 1.0, "engine-b"),
    ]
    assert calls[0][0] == str(tmp_path / "sweep" / "runs" / "m1-a__temp0")
    assert all(c[4] == {"answer_regex": "x"} for c in calls)  # sweep keys are not passed on
    assert [r["accuracy"] for r in rows] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    saved = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [r["name"] for r in saved["runs"]] == [r["name"] for r in rows]
    table = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "| m2-b__temp1 | b | (default) | 1 | 10 | 0 | 40.0% | - | - | - | 2.50 |" in table


def test_markdown_escapes_pipes_in_templates():
    row = {
        "name": "t1",
        "model": None,
        "prompt_template": "a | b",
        "temperature": None,
        "items": None,
        "errors": None,
        "accuracy": None,
        "macro_f1": None,
        "items_per_s": None,
    }
    assert "a \\| b" in markdown_table([row])
