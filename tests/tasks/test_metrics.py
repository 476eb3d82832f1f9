"""Eval metrics on hand-made cases."""

from __future__ import annotations

import re

import pytest

from bulkrun.tasks.metrics import (
    NO_ANSWER,
    answers_match,
    classification_metrics,
    extract_answer,
    format_metrics,
    generation_metrics,
    metrics_lines,
)

LABELS = ["billing", "bug", "feature"]


def test_confusion_matrix_and_per_label_figures():
    pairs = [
        ("billing", "billing"),
        ("billing", "bug"),
        ("bug", "bug"),
        ("bug", "bug"),
        ("feature", "bug"),
        ("feature", "billing"),
    ]
    m = classification_metrics(pairs, LABELS)
    assert m["items"] == 6 and m["correct"] == 3 and m["accuracy"] == pytest.approx(0.5)
    assert m["confusion"] == {
        "billing": {"billing": 1, "bug": 1, "feature": 0},
        "bug": {"billing": 0, "bug": 2, "feature": 0},
        "feature": {"billing": 1, "bug": 1, "feature": 0},
    }
    billing, bug = m["per_label"]["billing"], m["per_label"]["bug"]
    assert billing["precision"] == pytest.approx(1 / 2) and billing["recall"] == pytest.approx(1 / 2)
    assert bug["precision"] == pytest.approx(2 / 4) and bug["recall"] == pytest.approx(1.0)
    assert bug["f1"] == pytest.approx(2 * 0.5 * 1.0 / 1.5)


def test_label_never_predicted_has_undefined_precision_and_zero_recall():
    m = classification_metrics([("billing", "bug"), ("feature", "bug"), ("bug", "bug")], LABELS)
    feature = m["per_label"]["feature"]
    assert feature["predicted"] == 0 and feature["precision"] is None
    assert feature["recall"] == 0.0 and feature["support"] == 1 and feature["f1"] is None
    # macro F1 counts an undefined F1 as 0 over labels that occur: (0 + 0.5 + 0) / 3
    assert m["macro_f1"] == pytest.approx((2 * (1 / 3) * 1 / (1 / 3 + 1)) / 3)


def test_label_never_expected_has_undefined_recall():
    m = classification_metrics([("billing", "feature"), ("bug", "bug")], LABELS)
    feature = m["per_label"]["feature"]
    assert feature["support"] == 0 and feature["recall"] is None and feature["precision"] == 0.0


def test_prediction_outside_labels_goes_to_no_answer_column():
    m = classification_metrics([("bug", None), ("bug", "bug")], LABELS)
    assert m["confusion"]["bug"][NO_ANSWER] == 1
    assert m["confusion"]["billing"][NO_ANSWER] == 0
    assert m["accuracy"] == pytest.approx(0.5)


def test_expected_outside_labels_is_an_error():
    with pytest.raises(ValueError, match="not one of"):
        classification_metrics([("refund", "bug")], LABELS)


def test_empty_suite():
    m = classification_metrics([], LABELS)
    assert m["accuracy"] is None and m["items"] == 0
    assert "n/a" in format_metrics(m)[0]


def test_answer_extraction_and_matching():
    pattern = re.compile(r"answer is\s*(-?\d+)")
    assert extract_answer("So the answer is 42.", pattern) == "42"
    assert extract_answer("no number here", pattern) is None
    assert extract_answer("  Paris \n", None) == "Paris"
    assert extract_answer("x = 7", re.compile(r"\d+")) == "7"  # no group: the whole match
    assert answers_match("Paris", "Paris", normalized=False)
    assert not answers_match("paris", "Paris", normalized=False)
    assert answers_match(" the  Eiffel\nTower.", "The Eiffel Tower", normalized=True)
    assert not answers_match(None, "x", normalized=True)


def test_generation_metrics_and_summary_lines():
    m = generation_metrics([(True, True), (False, True), (False, False)])
    assert m == {"kind": "generation", "items": 3, "correct": 1, "accuracy": 1 / 3, "no_answer": 1}
    assert format_metrics(m) == ["accuracy 33.3% (1/3), no answer extracted: 1"]
    lines = format_metrics(classification_metrics([("bug", "bug"), ("billing", "bug")], LABELS))
    assert lines[0] == "accuracy 50.0% (1/2)"
    assert any(line.startswith("feature") and " - " in line for line in lines)


def test_summary_lines_for_every_kind():
    m = classification_metrics([("billing", "bug"), ("bug", "bug"), ("feature", "feature")], LABELS)
    lines = metrics_lines(m)
    assert lines[0] == "accuracy 66.7% (2/3)"
    start = lines.index("confusion (rows expected, columns predicted):")
    assert lines[start + 2].split() == ["billing", "0", "1", "0"]
    classify = metrics_lines({"kind": "classify", "label_counts": {"bug": 3, "billing": 0}})
    assert classify == ["labels: bug 3, billing 0"]
    assert metrics_lines({"kind": "something else"}) == []


def test_metrics_accept_a_stream():
    m = classification_metrics(iter([("bug", "bug")]), LABELS)
    assert m["accuracy"] == 1.0
