"""--shard K/N: parsing, and that N slices together own every row exactly once."""

from __future__ import annotations

import pytest

from bulkrun.errors import UsageError
from bulkrun.job.slices import Partition, ShardError, all_partitions, parse_shard


@pytest.mark.parametrize("count", [1, 2, 3, 7, 16])
def test_slices_cover_every_row_exactly_once(count):
    rows = range(1000)
    owners = {row: [p.index for p in all_partitions(count) if p.owns(row)] for row in rows}
    assert all(len(found) == 1 for found in owners.values())


def test_rows_with_gaps_are_still_covered_once():
    rows = [0, 1, 5, 6, 9, 100, 101, 1001]  # JSONL blank lines leave gaps in row numbers
    parts = all_partitions(3)
    assert sorted(r for r in rows for p in parts if p.owns(r)) == rows


def test_slices_are_balanced_and_interleaved():
    sizes = [sum(1 for row in range(1001) if p.owns(row)) for p in all_partitions(4)]
    assert max(sizes) - min(sizes) <= 1
    assert [row for row in range(10) if Partition(1, 4).owns(row)] == [1, 5, 9]


@pytest.mark.parametrize(
    "text,expected", [("0/4", (0, 4)), ("3/4", (3, 4)), (" 2 / 8 ", (2, 8)), ("0/1", (0, 1))]
)
def test_parse_shard_accepts_zero_based(text, expected):
    part = parse_shard(text)
    assert (part.index, part.count) == expected
    assert str(part) == f"{expected[0]}/{expected[1]}"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("4/4", "0-based"),
        ("5/4", "below N"),
        ("1/0", "at least 1"),
        ("a/b", "K/N"),
        ("3", "K/N"),
        ("-1/4", "K/N"),
    ],
)
def test_parse_shard_rejects_with_a_clear_message(text, needle):
    with pytest.raises(ShardError, match=needle) as info:
        parse_shard(text)
    assert isinstance(info.value, UsageError)  # the CLI turns it into exit code 2, one line


def test_tag_round_trip_and_rejects_foreign_names():
    part = Partition(2, 8)
    assert part.tag == "s2of8"
    assert Partition.from_tag("s2of8") == part
    with pytest.raises(ValueError):
        Partition.from_tag("part-00001")
    with pytest.raises(ShardError):
        Partition.from_tag("s9of8")
