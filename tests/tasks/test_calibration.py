"""Contextual calibration: the prior from content-free inputs, dividing it out, and that it removes
a bias the prompt puts on the labels."""

from __future__ import annotations

import math
import random

import pytest

from bulkrun.tasks.calibration import (
    DEFAULT_CONTENT_FREE_INPUTS,
    CalibrationError,
    Calibrator,
    argmax,
    calibrate,
    content_free_prior,
    normalized_probs,
)


def logs(values):
    return [math.log(v) for v in values]


def test_the_papers_content_free_inputs_are_the_default():
    assert DEFAULT_CONTENT_FREE_INPUTS == ("N/A", "[MASK]", "")


def test_normalized_probs_is_a_softmax_of_the_scores():
    assert normalized_probs(logs([1, 3])) == pytest.approx([0.25, 0.75])
    assert normalized_probs([-1000.0, -1000.0 + math.log(3)]) == pytest.approx([0.25, 0.75])
    assert normalized_probs([0.0, -math.inf]) == [1.0, 0.0]


@pytest.mark.parametrize("scores", [[], [math.nan, 0.0], [-math.inf, -math.inf], [math.inf, 0.0]])
def test_unusable_scores_are_refused(scores):
    with pytest.raises(CalibrationError):
        normalized_probs(scores)


def test_prior_is_the_normalized_mean_of_the_label_probabilities():
    # As the paper's code: probabilities averaged over the inputs, then normalized, so the input
    # after which the labels take more mass (0.8 against 0.08) weighs more.
    prior = content_free_prior([logs([0.6, 0.2]), logs([0.02, 0.06])])
    assert prior == pytest.approx([0.62 / 0.88, 0.26 / 0.88])
    assert content_free_prior([logs([1, 1, 2])]) == pytest.approx([0.25, 0.25, 0.5])


def test_prior_of_very_unlikely_labels_stays_in_range():
    # Log-scores far below exp()'s range: only their differences matter.
    prior = content_free_prior([[-2000.0, -2000.0 + math.log(3)], [-2001.0, -2001.0 + math.log(3)]])
    assert prior == pytest.approx([0.25, 0.75])


def test_prior_needs_inputs_of_one_label_set_and_no_impossible_label():
    with pytest.raises(CalibrationError, match="at least one"):
        content_free_prior([])
    with pytest.raises(CalibrationError, match="same labels"):
        content_free_prior([[0.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(CalibrationError, match="probability 0"):
        content_free_prior([[0.0, -math.inf]])


def test_calibrate_divides_by_the_prior_and_renormalizes():
    assert calibrate([0.5, 0.5], [0.8, 0.2]) == pytest.approx([0.2, 0.8])
    assert calibrate([0.8, 0.2], [0.8, 0.2]) == pytest.approx([0.5, 0.5])
    with pytest.raises(CalibrationError, match="2 label probabilities"):
        calibrate([0.5, 0.5], [1 / 3] * 3)


def test_a_content_free_input_comes_out_uniform():
    cf = logs([0.07, 0.02, 0.01])
    calibrated = Calibrator.from_content_free([cf])(cf)
    assert calibrated.calibrated == pytest.approx([1 / 3] * 3)
    assert calibrated.raw == pytest.approx([0.7, 0.2, 0.1])


def test_identity_calibrator_changes_nothing():
    result = Calibrator.identity(3)(logs([0.2, 0.5, 0.3]))
    assert result.calibrated == pytest.approx(result.raw)
    assert result.raw == pytest.approx([0.2, 0.5, 0.3])
    assert result.best == result.best_raw == 1


def test_argmax_takes_the_first_of_equal_values():
    assert argmax([0.1, 0.4, 0.4]) == 1


def test_calibration_removes_a_constructed_bias():
    """Items whose true label distributions are clear, scored under a prompt that multiplies every
    label's probability by a fixed bias (mostly towards label 0): raw argmax says label 0 for most
    items, calibration with the bias seen on content-free inputs recovers every true label."""
    rng = random.Random(0)
    labels = 4
    bias = [0.85, 0.08, 0.05, 0.02]
    items, truth = [], []
    for n in range(200):
        true_label = n % labels
        clean = [rng.uniform(0.02, 0.1) for _ in range(labels)]
        clean[true_label] = rng.uniform(0.4, 0.6)
        # Scores as the model gives them: log(true probability * bias), on an arbitrary scale.
        items.append([math.log(c * b) - 7.0 for c, b in zip(clean, bias, strict=True)])
        truth.append(true_label)
    # Content-free inputs carry the bias and a little noise of their own.
    content_free = [[math.log(b * rng.uniform(0.9, 1.1)) - 3.0 for b in bias] for _ in range(3)]
    calibrator = Calibrator.from_content_free(content_free)
    assert calibrator.prior == pytest.approx(bias, rel=0.1)

    results = [calibrator(scores) for scores in items]
    raw_accuracy = sum(r.best_raw == t for r, t in zip(results, truth, strict=True)) / len(truth)
    calibrated_accuracy = sum(r.best == t for r, t in zip(results, truth, strict=True)) / len(truth)
    assert sum(r.best_raw == 0 for r in results) > 0.7 * len(results)
    assert raw_accuracy < 0.5
    assert calibrated_accuracy == 1.0
    for r in results:
        assert sum(r.calibrated) == pytest.approx(1.0)
        assert sum(r.raw) == pytest.approx(1.0)
