"""Slice "done" markers: export merges only complete splits and names the missing slices otherwise."""

from __future__ import annotations

import pytest

from bulkrun.distributed.outfs import OutDir
from bulkrun.distributed.partition import Partition, all_partitions
from bulkrun.distributed.slices import (
    IncompleteSlices,
    check_complete,
    mark_slice_done,
    merge_reports,
    read_slice_markers,
    slice_reports,
)
from bulkrun.errors import EXIT_INCOMPLETE


def test_a_plain_run_has_no_slices(tmp_path):
    assert check_complete(str(tmp_path)) is None


def test_incomplete_split_lists_the_missing_slices(tmp_path):
    for index in (0, 1, 3, 4):
        mark_slice_done(str(tmp_path), Partition(index, 6), {"items": 1})
    with pytest.raises(IncompleteSlices) as info:
        check_complete(str(tmp_path))
    assert info.value.missing == {6: [2, 5]}
    assert "2/6, 5/6" in str(info.value)
    assert info.value.exit_code == EXIT_INCOMPLETE


def test_complete_split_is_accepted_whatever_other_splits_left(tmp_path):
    mark_slice_done(str(tmp_path), Partition(0, 4), {"items": 1})  # an earlier, abandoned 4-way split
    for part in all_partitions(2):
        mark_slice_done(str(tmp_path), part, {"items": 5})
    assert check_complete(str(tmp_path)) == 2
    assert [r["items"] for r in slice_reports(str(tmp_path), 2)] == [5, 5]


def test_markers_of_another_job_do_not_count(tmp_path):
    mark_slice_done(str(tmp_path), Partition(0, 2), {}, fingerprint="old")
    mark_slice_done(str(tmp_path), Partition(1, 2), {}, fingerprint="new")
    with pytest.raises(IncompleteSlices, match="0/2"):
        check_complete(str(tmp_path), fingerprint="new")


def test_foreign_and_temporary_files_are_ignored(tmp_path):
    (tmp_path / "slices").mkdir()
    (tmp_path / "slices" / "notes.json").write_text("{}")
    (tmp_path / "slices" / "s0of2.json").write_text("{broken")
    (tmp_path / "slices" / ".tmp-abc-s1of2.json").write_text("{}")
    assert read_slice_markers(str(tmp_path)) == {}


def test_markers_work_on_a_filesystem_uri(tmp_path):
    uri = tmp_path.as_uri()  # file:///... goes through pyarrow.fs like s3:// would
    assert OutDir(uri).remote
    for part in all_partitions(3):
        mark_slice_done(uri, part, {"items": 2})
    assert check_complete(uri) == 3
    assert check_complete(str(tmp_path)) == 3  # the same files, seen as a local path


def test_merge_reports_sums_counts_takes_longest_wall_and_weights_means():
    merged = merge_reports(
        [
            {
                "items": 10,
                "errors": 1,
                "generated_tokens": 100,
                "wall_s": 5.0,
                "prefix_hit_rate": 0.5,
                "model": "m",
            },
            {
                "items": 30,
                "errors": 0,
                "generated_tokens": 300,
                "wall_s": 9.0,
                "prefix_hit_rate": 0.1,
                "model": "m",
            },
        ]
    )
    assert merged["items"] == 40 and merged["errors"] == 1 and merged["generated_tokens"] == 400
    assert merged["wall_s"] == 9.0
    assert merged["prefix_hit_rate"] == pytest.approx((10 * 0.5 + 30 * 0.1) / 40)
    assert merged["model"] == "m"
    assert merge_reports([]) == {}
