"""Contextual calibration of label probabilities (Zhao et al. 2021, "Calibrate Before Use").

A prompt biases a model towards some labels whatever the item says (the label named last, the one
most frequent in the examples, a common word). The bias is estimated by scoring the labels after
content-free inputs ("N/A", "[MASK]", the empty string) under the very same prompt: their label
probabilities, averaged over the inputs and normalized, are the prior p_cf. Each item's normalized
probabilities are then divided by p_cf (the paper's W = diag(p_cf)^-1, b = 0) and renormalized, so a
content-free input comes out uniform and an item wins a label only by beating the prompt's prior.

Pure functions on label log-scores (any real numbers whose softmax is the label distribution, e.g.
the summed token log-probabilities of each label): easy to test on hand-made cases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# The paper's three content-free inputs, averaged (its Section 5).
DEFAULT_CONTENT_FREE_INPUTS: tuple[str, ...] = ("N/A", "[MASK]", "")
CALIBRATE_MODES = ("content-free", "none")


class CalibrationError(ValueError):
    """Scores the calibration cannot use; the message says why."""


def normalized_probs(scores: Sequence[float]) -> list[float]:
    """Softmax of label log-scores: the label distribution the scores stand for."""
    if not scores:
        raise CalibrationError("no label scores")
    if not all(math.isfinite(s) or s == -math.inf for s in scores):
        raise CalibrationError(f"label scores must be finite or -inf, got {list(scores)}")
    top = max(scores)
    if top == -math.inf:
        raise CalibrationError("every label has probability 0")
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


def content_free_prior(content_free_scores: Sequence[Sequence[float]]) -> list[float]:
    """p_cf: the labels' probabilities after the content-free inputs, averaged over the inputs and
    then normalized, as the paper's reference code does (`get_p_content_free`).

    The average is of the labels' own probabilities (exp of their log-scores), so an input after
    which the model expects a label at all weighs more than one after which it expects other text;
    on the shipped tickets it is more accurate than averaging each input's normalized distribution
    (docs/benchmarks.md)."""
    if not content_free_scores:
        raise CalibrationError("calibration needs at least one content-free input")
    width = len(content_free_scores[0])
    if any(len(scores) != width for scores in content_free_scores):
        raise CalibrationError("every content-free input must score the same labels")
    for scores in content_free_scores:
        normalized_probs(scores)  # the same checks: no NaN, some label possible
    top = max(max(scores) for scores in content_free_scores)  # a common scale keeps exp() in range
    masses = [[math.exp(s - top) for s in scores] for scores in content_free_scores]
    mean = [sum(column) / len(masses) for column in zip(*masses, strict=True)]
    prior = [m / sum(mean) for m in mean]
    if min(prior) <= 0.0:  # a label the prompt can never produce: dividing by its prior is undefined
        raise CalibrationError(f"the content-free prior gives a label probability 0: {prior}")
    return prior


def calibrate(probs: Sequence[float], prior: Sequence[float]) -> list[float]:
    """q = normalize(diag(prior)^-1 p): each label's probability relative to its prior."""
    if len(probs) != len(prior):
        raise CalibrationError(f"{len(probs)} label probabilities but a prior over {len(prior)} labels")
    ratios = [p / q for p, q in zip(probs, prior, strict=True)]
    total = sum(ratios)
    return [r / total for r in ratios]


@dataclass(frozen=True, slots=True)
class Calibrated:
    raw: list[float]  # the item's normalized label probabilities
    calibrated: list[float]  # the same, divided by the prior and renormalized
    best_raw: int  # argmax of raw (ties: the first label)
    best: int  # argmax of calibrated (ties: the first label)


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties (as numpy.argmax)."""
    return max(range(len(values)), key=values.__getitem__)


@dataclass(frozen=True, slots=True)
class Calibrator:
    """The prior of one prompt; calibrates every item scored under that prompt."""

    prior: tuple[float, ...]

    @classmethod
    def from_content_free(cls, content_free_scores: Sequence[Sequence[float]]) -> Calibrator:
        return cls(tuple(content_free_prior(content_free_scores)))

    @classmethod
    def identity(cls, num_labels: int) -> Calibrator:
        """`--calibrate none`: a uniform prior leaves every distribution as it is."""
        return cls(tuple([1.0 / num_labels] * num_labels))

    def __call__(self, scores: Sequence[float]) -> Calibrated:
        raw = normalized_probs(scores)
        calibrated = calibrate(raw, self.prior)
        return Calibrated(raw, calibrated, argmax(raw), argmax(calibrated))
