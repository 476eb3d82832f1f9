"""Slice "done" markers: export merges only complete splits and names the missing slices otherwise."""

from __future__ import annotations

import pytest

from bulkrun.errors import EXIT_INCOMPLETE
from bulkrun.io.outdir import OutDir
from bulkrun.job.slices import (
    IncompleteSlices,
    Partition,
    all_partitions,
    check_complete,
    mark_slice_done,
    read_slice_markers,
)
from bulkrun.job.stats import RunStats


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
    markers = read_slice_markers(str(tmp_path))
    assert [markers[p]["stats"]["items"] for p in all_partitions(2)] == [5, 5]


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


def test_run_stats_merge_is_explicit_per_field():
    a = RunStats(items=10, errors=1, generated_tokens=100, prompt_tokens=50, cached_prompt_tokens=40,
                 steps=4, running_sum=8, kv_used_sum=2.0, kv_peak=0.5, wall_s=5.0)  # fmt: skip
    b = RunStats(items=30, generated_tokens=300, prompt_tokens=150, cached_prompt_tokens=10,
                 steps=6, running_sum=30, kv_used_sum=1.2, kv_peak=0.9, wall_s=9.0)  # fmt: skip
    merged = RunStats.merge([a, RunStats.from_dict(b.to_dict())])
    assert (merged.items, merged.errors, merged.generated_tokens) == (40, 1, 400)
    assert merged.wall_s == 9.0 and merged.kv_peak == 0.9  # slices side by side: the longest, the highest
    summary = merged.summary()
    assert summary["mean_running_batch"] == round(38 / 10, 2)  # weighted by steps, not by slices
    assert summary["prefix_cache_hit_rate"] == round(50 / 200, 4)
    assert summary["items_per_s"] == round(41 / 9.0, 3)
    assert RunStats.merge([a, b], wall_s=20.0).summary()["wall_time_s"] == 20.0
