"""The end-of-job summary on stderr: the run's figures, then the task's metrics as text."""

from __future__ import annotations

from bulkrun.job.stats import summary_lines
from bulkrun.tasks.metrics import classification_metrics

REPORT = {"task": "eval", "out": "runs/x", "rows": 3, "complete": True, "results_total": 3, "errors_total": 0}


def test_an_eval_summary_shows_accuracy_per_label_figures_and_the_confusion_matrix():
    metrics = classification_metrics([("bug", "bug"), ("billing", "bug"), ("bug", "bug")], ["billing", "bug"])
    lines = summary_lines(REPORT | {"metrics": metrics})
    assert lines[0] == "bulkrun eval: done -> runs/x"
    assert "  accuracy 66.7% (2/3)" in lines
    assert any(line.split() == ["billing", "-", "0%", "1"] for line in lines)  # never predicted: no precision
    start = lines.index("  confusion (rows expected, columns predicted):")
    assert lines[start + 2].split() == ["billing", "0", "1"]


def test_a_job_without_metrics_has_no_metrics_lines():
    lines = summary_lines(REPORT | {"task": "generate", "metrics": None})
    assert not any("accuracy" in line for line in lines)
