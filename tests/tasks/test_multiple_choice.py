"""Multiple-choice rows: validation, lm-evaluation-harness's tokenization of (context, choice) and
its acc / acc_norm, on hand-made cases and the default tokenizer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.multiple_choice import lm_eval_acc, lm_eval_encode

from bulkrun.tasks.base import RowError
from bulkrun.tasks.multiple_choice import (
    CHAT_TARGET_DELIMITER,
    TARGET_DELIMITER,
    ChoiceRow,
    choice_columns,
    continuations,
    encode_choices,
    encode_pair,
    expected_index,
    mean_stderr,
    metrics_lines,
    move_trailing_whitespace,
    multiple_choice_metrics,
    parse_choices,
    parse_row,
)

CHOICES = ("Paris", "Lyon", "a city in the south of France")


def row_error(fn, *args) -> str:
    with pytest.raises(RowError) as caught:
        fn(*args)
    return caught.value.kind


def test_delimiters_are_lm_eval_harness_defaults():
    assert TARGET_DELIMITER == " " and CHAT_TARGET_DELIMITER == ""
    assert continuations(["a", "b c"]) == [" a", " b c"]
    assert continuations(["a"], CHAT_TARGET_DELIMITER) == ["a"]


@pytest.mark.parametrize("value", [["x"], ["a", "b", "c", "d", "e", "f", "g"], ("a", "b"), '["a", "b"]'])
def test_choices_of_any_count(value):
    assert parse_choices(value) == tuple(value if not isinstance(value, str) else ["a", "b"])


def test_numpy_choices_from_parquet():
    assert parse_choices(np.array(["a", "b"])) == ("a", "b")


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "missing_choices"),
        ([], "empty_choices"),
        ("[]", "empty_choices"),
        ("a,b", "bad_choices"),
        ("[not json", "bad_choices"),
        ({"a": 1}, "bad_choices"),
        (3, "bad_choices"),
        (["a", 2], "bad_choices"),
        (["a", ""], "bad_choices"),
    ],
)
def test_unusable_choices_are_row_errors(value, kind):
    assert row_error(parse_choices, value) == kind


@pytest.mark.parametrize(
    ("value", "index"),
    [(0, 0), (2, 2), (np.int64(1), 1), (1.0, 1), ("Lyon", 1), ("2", 2), (" 2 ", 2)],
)
def test_expected_answer_as_index_or_choice_text(value, index):
    assert expected_index(value, CHOICES) == index


def test_a_digit_choice_is_matched_as_text_before_as_index():
    assert expected_index("1", ("3", "1", "2")) == 1
    assert expected_index("2", ("3", "1", "2")) == 2


def test_equal_choices_take_the_first():
    assert expected_index("b", ("a", "b", "b")) == 1


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "missing_expected"),
        ("  ", "missing_expected"),
        (3, "expected_out_of_range"),
        (-1, "expected_out_of_range"),
        ("7", "expected_out_of_range"),
        ("paris", "expected_not_a_choice"),
        ("Marseille", "expected_not_a_choice"),
        (True, "bad_expected"),
        (1.5, "bad_expected"),
        ([0], "bad_expected"),
    ],
)
def test_unusable_expected_answers_are_row_errors(value, kind):
    assert row_error(expected_index, value, CHOICES) == kind


def test_parse_row_reads_the_named_fields():
    row = parse_row({"opts": ["x", "y"], "gold": "y"}, "opts", "gold")
    assert row == ChoiceRow(("x", "y"), 1)
    assert row_error(parse_row, {"gold": 0}, "opts", "gold") == "missing_choices"


def test_trailing_whitespace_moves_to_the_continuation():
    assert move_trailing_whitespace("Answer: ", " x") == ("Answer:", "  x")
    assert move_trailing_whitespace("Q\n\n", "x") == ("Q", "\n\nx")
    assert move_trailing_whitespace("Answer:", " x") == ("Answer:", " x")


def char_encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_encode_pair_takes_the_joint_tokenization_after_the_context():
    assert encode_pair(char_encode, "ab ", "c", prefix_token_id=0) == ([97, 98], [32, 99])


@pytest.mark.parametrize("context", ["", "   "])
def test_an_empty_context_is_the_prefix_token(context):
    assert encode_pair(char_encode, context, " c", prefix_token_id=7)[0] == [7]


def test_encode_pair_matches_lm_eval_harness_on_the_default_tokenizer(tokenizer):
    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    cases = [
        ("Question: What is the capital of France?\nAnswer:", " Paris"),
        ("Question: What is the capital of France?\nAnswer: ", " Paris"),
        ("The cat sat on the\n", " mat, then slept for the rest of the afternoon."),
        ("Fill in: 12+3=", "15"),
        ("", " anything"),
        ("Überprüfung der Lieferung", " läuft"),
    ]
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    for context, continuation in cases:
        assert encode_pair(encode, context, continuation, prefix) == lm_eval_encode(
            tokenizer, context, continuation
        )


def test_encode_choices_shares_the_context_ids(tokenizer):
    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    context = "Question: Which is a fruit?\nAnswer: "
    choices = ["apple", "a small red brick", "carburettor"]
    context_ids, ids = encode_choices(encode, context, choices, prefix_token_id=0)
    for choice, choice_ids in zip(choices, ids, strict=True):
        assert (context_ids, choice_ids) == lm_eval_encode(tokenizer, context, " " + choice)
    assert len(ids[1]) > 1  # multi-token choices


def test_a_choice_with_no_tokens_after_the_context_is_a_row_error():
    def merging_encode(text):  # a tokenizer that swallows a trailing "!" into the previous token
        return [ord(c) for c in text.replace("a!", "A")]

    assert row_error(encode_choices, merging_encode, "xa", ["!"], 0, "") == "bad_choices"


def test_acc_takes_the_largest_loglikelihood_and_acc_norm_the_largest_per_character():
    row = ChoiceRow(CHOICES, 2)
    lls = [-6.0, -5.5, -20.0]  # the long choice: lowest total, best per character (-20/29)
    columns = choice_columns(row, lls)
    assert columns == {
        "expected": CHOICES[2],
        "expected_index": 2,
        "loglikelihoods": lls,
        "predicted": "Lyon",
        "predicted_index": 1,
        "predicted_norm": CHOICES[2],
        "predicted_norm_index": 2,
        "correct": False,
        "correct_norm": True,
    }
    assert lm_eval_acc(lls, CHOICES, 2) == (False, True)


def test_ties_go_to_the_first_choice_as_numpy_argmax():
    columns = choice_columns(ChoiceRow(("ab", "cd"), 1), [-1.0, -1.0])
    assert columns["predicted_index"] == columns["predicted_norm_index"] == 0
    assert lm_eval_acc([-1.0, -1.0], ("ab", "cd"), 1) == (False, False)


def test_choice_columns_need_one_loglikelihood_per_choice():
    with pytest.raises(ValueError):
        choice_columns(ChoiceRow(("a", "b"), 0), [-1.0])


def test_stderr_is_lm_eval_harness_mean_stderr():
    scores = np.array([1, 0, 1, 1, 0, 1, 1])
    expected = np.std(scores, ddof=1) / math.sqrt(len(scores))
    assert mean_stderr(int(scores.sum()), len(scores)) == pytest.approx(expected)
    assert mean_stderr(1, 1) is None


def test_metrics_report_acc_and_acc_norm():
    records = [
        {"correct": True, "correct_norm": True},
        {"correct": False, "correct_norm": True},
        {"correct": False, "correct_norm": False},
        {"correct": True, "correct_norm": True},
    ]
    metrics = multiple_choice_metrics(iter(records))
    assert metrics["kind"] == "multiple_choice"
    assert (metrics["items"], metrics["correct"], metrics["correct_norm"]) == (4, 2, 3)
    assert metrics["acc"] == metrics["accuracy"] == 0.5
    assert metrics["acc_norm"] == 0.75
    assert metrics["acc_norm_stderr"] == pytest.approx(np.std([1, 1, 0, 1], ddof=1) / 2)
    lines = metrics_lines(metrics)
    assert lines[0].startswith("acc      50.0% ± ") and lines[0].endswith("(2/4)")
    assert lines[1].startswith("acc_norm 75.0% ± ") and lines[1].endswith("(3/4)")


def test_metrics_of_no_rows():
    metrics = multiple_choice_metrics([])
    assert metrics["acc"] is None and metrics["acc_stderr"] is None
    assert metrics_lines(metrics) == ["acc n/a (no scored rows)"]
