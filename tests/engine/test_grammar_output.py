"""Constrained outputs are parsed and validated, and a cut one is told apart from a wrong one."""

from __future__ import annotations

import pytest

from bulkrun.engine.structured_output.grammar import ConstraintSpec
from bulkrun.engine.structured_output.output import check_output

PERSON = ConstraintSpec.json_schema(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "born": {"type": "string", "format": "date"}},
        "required": ["name"],
        "additionalProperties": False,
    }
)


def test_a_valid_record_is_parsed():
    got = check_output(PERSON, '{"name":"Ada","born":"1815-12-10"}', "stop")
    assert got.ok and got.value == {"name": "Ada", "born": "1815-12-10"} and got.problem is None


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"name": "Ada"', "not valid JSON"),
        ('{"born":"1815-12-10"}', "'name' is a required property"),
        ('{"name":"Ada","born":"10 Dec 1815"}', "/born"),  # formats are checked
        ('{"name":"Ada","x":1}', "Additional properties"),
    ],
)
def test_an_invalid_output_says_why(text, words):
    got = check_output(PERSON, text, "stop")
    assert not got.ok and got.problem == "invalid" and words in got.message and got.value is None


def test_an_output_cut_by_max_tokens_is_truncated_not_invalid():
    got = check_output(PERSON, '{"name":"Ad', "length")
    assert not got.ok and got.problem == "truncated" and "max_tokens" in got.message


def test_a_complete_output_that_hit_max_tokens_exactly_is_fine():
    assert check_output(PERSON, '{"name":"Ada"}', "length").ok


def test_json_object_accepts_any_object_only():
    spec = ConstraintSpec.json_object()
    assert check_output(spec, '{"a":[1,2]}', "stop").value == {"a": [1, 2]}
    assert check_output(spec, "[1]", "stop").problem == "invalid"


def test_regex_and_choice_outputs():
    assert check_output(ConstraintSpec.regex(r"[0-9]{3}"), "123", "stop").ok
    assert check_output(ConstraintSpec.regex(r"[0-9]{3}"), "1234", "stop").problem == "invalid"
    choice = ConstraintSpec.choice(["yes", "no"])
    assert check_output(choice, "no", "stop").ok and check_output(choice, "no", "stop").value is None
    assert "not one of ['yes', 'no']" in check_output(choice, "maybe", "stop").message
