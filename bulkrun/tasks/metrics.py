"""Eval metrics: accuracy, per-label precision/recall/F1, a confusion matrix, and answer matching.

Plain Python on (expected, predicted) pairs so they are easy to test on hand-made cases. A precision
that is 0/0 (a label never predicted) is reported as None, not 0: "never said it" is not "always wrong".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

NO_ANSWER = "(no answer)"  # confusion-matrix column for a generation that yielded no answer


def normalize_answer(text: str) -> str:
    """Whitespace collapsed, case folded, surrounding space and a trailing period dropped."""
    return " ".join(text.split()).casefold().rstrip(".").strip()


def extract_answer(text: str, pattern: re.Pattern[str] | None) -> str | None:
    """The first capture group of the first match (the whole match without groups); None if no match."""
    if pattern is None:
        return text.strip()
    match = pattern.search(text)
    if match is None:
        return None
    value = match.group(1) if pattern.groups else match.group(0)
    return value.strip() if value is not None else None


def answers_match(predicted: str | None, expected: str, normalized: bool) -> bool:
    if predicted is None:
        return False
    if normalized:
        return normalize_answer(predicted) == normalize_answer(expected)
    return predicted == expected


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def _f1(precision: float | None, recall: float | None) -> float | None:
    if precision is None or recall is None:
        return None
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def classification_metrics(pairs: Iterable[tuple[str, str]], labels: Sequence[str]) -> dict:
    """Metrics over (expected, predicted) pairs for a fixed label order.

    The confusion matrix is `confusion[expected][predicted] = count` over every label in both
    dimensions (an extra NO_ANSWER column appears only if some prediction was outside the labels).
    """
    labels = list(labels)
    confusion = {e: {p: 0 for p in labels} for e in labels}
    total = correct = 0
    for expected, predicted in pairs:
        if expected not in confusion:
            raise ValueError(f"expected label {expected!r} is not one of {labels}")
        row = confusion[expected]
        column = predicted if predicted in row else NO_ANSWER
        row[column] = row.get(column, 0) + 1
        total += 1
        correct += expected == predicted
    if any(NO_ANSWER in row for row in confusion.values()):
        for row in confusion.values():
            row.setdefault(NO_ANSWER, 0)
    per_label = {}
    for label in labels:
        true_pos = confusion[label][label]
        support = sum(confusion[label].values())
        predicted = sum(confusion[e][label] for e in labels)
        precision, recall = _ratio(true_pos, predicted), _ratio(true_pos, support)
        per_label[label] = {
            "precision": precision,
            "recall": recall,
            "f1": _f1(precision, recall),
            "support": support,
            "predicted": predicted,
        }
    f1s = [m["f1"] or 0.0 for m in per_label.values() if m["support"]]
    return {
        "kind": "classification",
        "items": total,
        "correct": correct,
        "accuracy": _ratio(correct, total),
        "macro_f1": sum(f1s) / len(f1s) if f1s else None,
        "labels": labels,
        "per_label": per_label,
        "confusion": confusion,
    }


def generation_metrics(records: Iterable[tuple[bool, bool]]) -> dict:
    """Metrics over (correct, answered) pairs: exact-match accuracy and how many gave no answer."""
    total = correct = unanswered = 0
    for is_correct, answered in records:
        total += 1
        correct += bool(is_correct)
        unanswered += not answered
    return {
        "kind": "generation",
        "items": total,
        "correct": correct,
        "accuracy": _ratio(correct, total),
        "no_answer": unanswered,
    }


def metrics_lines(metrics: dict) -> list[str]:
    """Human lines for the end-of-job summary of any task's metrics (metrics.json)."""
    kind = metrics.get("kind")
    if kind == "classify":
        counts = metrics.get("label_counts") or {}
        lines = ["labels: " + ", ".join(f"{name} {count}" for name, count in counts.items())]
        lines += calibration_lines(metrics)
        if metrics.get("label_tokenization_fallbacks"):
            lines.append(
                f"note: on {metrics['label_tokenization_fallbacks']} prompts a label merged with the "
                "prompt's last token; those labels were tokenized on their own"
            )
        return lines
    if kind in ("classification", "generation"):
        lines = format_metrics(metrics)
        if kind == "classification" and metrics["items"]:
            lines += calibration_lines(metrics) + confusion_lines(metrics)
        return lines
    if kind == "multiple_choice":
        from bulkrun.tasks.multiple_choice import metrics_lines as multiple_choice_lines

        return multiple_choice_lines(metrics)
    return []


def calibration_lines(metrics: dict) -> list[str]:
    """The content-free prior the labels were calibrated against (and the uncalibrated accuracy)."""
    calibration = metrics.get("calibration") or {}
    if calibration.get("mode") != "content-free" or not calibration.get("prior"):
        return []
    prior = ", ".join(f"{name} {p:.2f}" for name, p in calibration["prior"].items())
    line = f"calibrated against the content-free prior: {prior}"
    if metrics.get("raw_accuracy") is not None:
        line += f" (uncalibrated accuracy {metrics['raw_accuracy']:.1%})"
    return [line]


def confusion_lines(metrics: dict) -> list[str]:
    """The confusion matrix as text: a row per expected label, a column per predicted one."""
    confusion = metrics["confusion"]
    columns = list(next(iter(confusion.values())))
    width = max(len(str(c)) for c in [*columns, "expected"]) + 1
    lines = ["confusion (rows expected, columns predicted):"]
    lines.append(" " * width + "".join(f"{str(c)[: width - 1]:>{width}}" for c in columns))
    for expected, row in confusion.items():
        lines.append(f"{expected[: width - 1]:<{width}}" + "".join(f"{row[c]:>{width}}" for c in columns))
    return lines


def format_metrics(metrics: dict) -> list[str]:
    """A few human lines for the end-of-job summary."""
    acc = metrics.get("accuracy")
    acc_text = "n/a" if acc is None else f"{acc:.1%}"
    lines = [f"accuracy {acc_text} ({metrics['correct']}/{metrics['items']})"]
    if metrics["kind"] == "generation":
        lines[0] += f", no answer extracted: {metrics['no_answer']}"
        return lines
    width = max(len(label) for label in metrics["labels"])
    lines.append(f"{'label':<{width}}  precision  recall  support")
    for label, m in metrics["per_label"].items():
        lines.append(
            f"{label:<{width}}  {_pct(m['precision']):>9}  {_pct(m['recall']):>6}  {m['support']:>7}"
        )
    return lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
