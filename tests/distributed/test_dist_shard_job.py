"""--shard K/N through the CLI on a real (tiny) model: the slices share one OUT, cover every row
exactly once, and `bulkrun export` merges them only when all are done, naming the missing ones."""

from __future__ import annotations

from pathlib import Path

from helpers.rows import committed_rows, duplicated_rows, read_results

from bulkrun.cli import main
from bulkrun.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE
from bulkrun.io.shards import RESULTS_DIR, shard_paths, shard_rows

N = 3


def run_slice(source, args, out, k, n=N) -> int:
    return main(["generate", source, "--out", str(out), *args, "--shard", f"{k}/{n}"])


def test_slices_cover_every_row_once_and_export_waits_for_all(tiny_job, reference_results, tmp_path, capsys):
    source, args = tiny_job
    out = tmp_path / "out"
    for k in (0, 2):
        assert run_slice(source, args, out, k) == EXIT_OK

    capsys.readouterr()
    assert main(["export", str(out)]) == EXIT_INCOMPLETE
    message = capsys.readouterr().err
    assert "1/3" in message and "0/3" not in message and "2/3" not in message
    assert not (out / "results.jsonl").exists()

    assert run_slice(source, args, out, 1) == EXIT_OK
    for path in shard_paths(out / RESULTS_DIR):  # each slice wrote only its own rows
        k = int(path.name.split("-")[1][1:].split("of")[0])
        assert all(row % N == k for row in shard_rows(path))
    assert sorted(committed_rows(out)) == list(range(len(reference_results)))
    assert duplicated_rows(out) == []

    assert main(["export", str(out)]) == EXIT_OK
    assert read_results(out) == reference_results


def test_a_slice_rerun_after_it_finished_does_nothing_twice(tiny_job, tmp_path):
    source, args = tiny_job
    out = tmp_path / "out"
    assert run_slice(source, args, out, 1) == EXIT_OK
    before = sorted(committed_rows(out))
    assert run_slice(source, args, out, 1) == EXIT_OK
    assert sorted(committed_rows(out)) == before


def test_a_bad_shard_value_stops_before_any_work(tiny_job, tmp_path, capsys):
    source, args = tiny_job
    out = tmp_path / "out"
    assert run_slice(source, args, out, 3, 3) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--shard" in err and "3/3" in err
    assert not Path(out).exists() or not any(Path(out).iterdir())
