"""Sweep logic, the pure part: the combinations a sweep's options name, and the comparison table."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrun.exceptions import UsageError
from bulkrun.tasks.sweep import SweepError, combinations, is_sweep, markdown_table, template_files


def test_combinations_name_every_swept_dimension():
    options = {
        "sweep_model": "models/a.gguf,/x/b",
        "sweep_template": ["Answer: {question}", "@prompts/terse.txt"],
        "sweep_temperature": [0, 0.7],
    }
    assert template_files(options) == [Path("prompts/terse.txt")]
    combos = combinations(options, has_labels=False, files={Path("prompts/terse.txt"): "Q: {question}\nA:"})
    assert len(combos) == 8
    assert combos[0].name == "m1-a__t1__temp0" and combos[-1].name == "m2-b__t2__temp0.7"
    assert len({c.name for c in combos}) == 8
    assert combos[-1].template == "Q: {question}\nA:" and combos[-1].template_label == "terse.txt"
    assert combinations({"sweep_temperature": "0.5"}, False)[0].name == "temp0.5"


def test_bad_sweeps_are_refused():
    with pytest.raises(SweepError, match="no effect on a suite with labels"):
        combinations({"sweep_temperature": [0.5]}, has_labels=True)
    with pytest.raises(SweepError, match="same value twice"):
        combinations({"sweep_model": "a,a"}, False)
    with pytest.raises(SweepError, match="not a number"):
        combinations({"sweep_temperature": "hot"}, False)
    assert issubclass(SweepError, UsageError)  # a bad option: exit code 2
    assert not is_sweep({"sweep_model": None}) and is_sweep({"sweep_model": ["a"]})


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
