"""Label parsing: comma lists, label files with descriptions, job-spec forms, and what is refused."""

from __future__ import annotations

import pytest

from bulkrun.tasks.labels import (
    LabelError,
    LabelSet,
    label_set_from_options,
    labels_from_cli,
    labels_from_spec,
    parse_label_lines,
    parse_label_list,
)


def test_comma_list_strips_spaces_and_keeps_order():
    labels = parse_label_list(" billing, bug ,feature")
    assert labels.names == ("billing", "bug", "feature")
    assert labels.descriptions == {}


def test_label_file_with_descriptions_and_comments(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text(
        "# support queues\nbilling: payments, invoices, refunds\n\nbug: something is broken\nfeature\n",
        encoding="utf-8",
    )
    labels = labels_from_cli(str(path))
    assert labels.names == ("billing", "bug", "feature")
    assert labels.description("billing") == "payments, invoices, refunds"
    assert labels.description("feature") is None
    assert labels_from_cli(f"@{path}").names == labels.names


def test_spec_forms_and_description_merge():
    labels = labels_from_spec(
        [{"name": "billing", "description": "money"}, "bug"], descriptions={"bug": "broken things"}
    )
    assert labels.names == ("billing", "bug")
    assert dict(labels.descriptions) == {"billing": "money", "bug": "broken things"}
    assert labels_from_spec("a,b").names == ("a", "b")


@pytest.mark.parametrize("text", ["billing", "billing,", "  "])
def test_one_label_is_refused(text):
    with pytest.raises(LabelError, match="at least two labels|empty label"):
        parse_label_list(text)


def test_one_label_message_names_the_label():
    with pytest.raises(LabelError, match=r"at least two labels, got only 'billing'"):
        labels_from_spec(["billing"])


@pytest.mark.parametrize(
    "names, message",
    [
        (["bug", "billing", "bug"], r"duplicate label 'bug'"),
        (["Bug", "billing", "bug"], r"duplicate label 'bug' \(also given as 'Bug'\)"),
    ],
)
def test_duplicates_are_refused(names, message):
    with pytest.raises(LabelError, match=message):
        labels_from_spec(names)


def test_duplicates_in_a_label_file_are_refused():
    with pytest.raises(LabelError, match="duplicate label 'bug'"):
        parse_label_lines(["bug: one", "billing", "bug: two"])


def test_empty_entry_and_bad_types_are_refused():
    with pytest.raises(LabelError, match="empty label"):
        parse_label_list("a,,b")
    with pytest.raises(LabelError, match="must be a string"):
        labels_from_spec(["a", 3])
    with pytest.raises(LabelError, match="line break"):
        LabelSet(("a", "b\nc"))
    with pytest.raises(LabelError, match="unknown labels: c"):
        labels_from_spec(["a", "b"], descriptions={"c": "?"})


def test_options_need_exactly_one_source(tmp_path):
    path = tmp_path / "l.txt"
    path.write_text("x\ny\n", encoding="utf-8")
    assert label_set_from_options({"labels_file": str(path)}).names == ("x", "y")
    with pytest.raises(LabelError, match="either labels or labels_file"):
        label_set_from_options({"labels": "a,b", "labels_file": str(path)})
    with pytest.raises(LabelError, match="no labels given"):
        label_set_from_options({})
    with pytest.raises(LabelError, match="cannot read label file"):
        label_set_from_options({"labels_file": str(tmp_path / "missing.txt")})


def test_find_ignores_case_and_space():
    labels = parse_label_list("Billing,bug")
    assert labels.find("  billing ") == "Billing"
    assert labels.find("feature") is None
