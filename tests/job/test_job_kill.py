"""kill -9 at random points: the rerun finishes the job, every row exactly once, and the results
equal an uninterrupted run's (greedy, tiny real model, real engine, real subprocesses)."""

from __future__ import annotations

import os
import random
import signal
import textwrap
from pathlib import Path

from helpers.processes import start_and_kill, start_until_marker
from helpers.rows import read_jsonl, recorded_rows, texts, write_jsonl

from bulkrun.cli import main

N_ROWS = 24
ROWS = texts(N_ROWS)
ROWS[7] = {"id": "r7", "text": ""}  # an error record is committed exactly once too
FLAGS = ["--id-field", "id", "--max-tokens", "6", "--checkpoint-every", "3", "--window", "6",
         "--max-num-seqs", "2", "--kv-cache-bytes", "16MiB", "--quiet"]  # fmt: skip


# The kill points are drawn from a fixed seed, so a failure is reproducible; set BULKRUN_KILL_SEED to
# explore others.
KILL_SEED = int(os.environ.get("BULKRUN_KILL_SEED", "20261201"))

# Runs bulkrun with a pause right after its first result shard is committed, so a signal sent once
# the marker file exists surely lands mid-job (not before any work, not after the last row).
PAUSE_AFTER_FIRST_SHARD = textwrap.dedent("""
    import pathlib, sys, time
    from bulkrun.io import shards
    marker, sys.argv = pathlib.Path(sys.argv[1]), ["bulkrun", *sys.argv[2:]]
    commit, paused = shards.ShardWriter.commit, []
    def pausing_commit(self):
        path = commit(self)
        if path is not None and path.parent.name == "shards" and not paused:
            paused.append(path)
            marker.touch()
            time.sleep(120)  # the signal lands here
        return path
    shards.ShardWriter.commit = pausing_commit
    from bulkrun.cli import main
    main()
""")


def _args(path: Path, out: Path, model: Path) -> list[str]:
    return ["generate", str(path), "--out", str(out), "--model", str(model), *FLAGS]


def test_resume_after_kill_9_is_exactly_once(tmp_path, tiny_model):
    path = write_jsonl(tmp_path / "in.jsonl", ROWS)
    assert main(_args(path, tmp_path / "clean", tiny_model)) == 3  # finished, with one row error
    clean_results = read_jsonl(tmp_path / "clean" / "results.jsonl")
    clean_errors = read_jsonl(tmp_path / "clean" / "errors.jsonl")
    seed = KILL_SEED
    rng = random.Random(seed)
    cut_mid_job = 0
    # Per trial, the kill points: (stage, delay). The first is surely mid-job (right after the
    # first commit); the others are random, from start-up to several commits in.
    trials = [[(1, 0.0)], [(rng.randint(0, 2), rng.uniform(0, 0.3))],
              [(rng.randint(0, 2), rng.uniform(0, 0.3)), (rng.randint(1, 3), rng.uniform(0, 0.3))]]  # fmt: skip
    for trial, kills in enumerate(trials):
        out = tmp_path / f"trial{trial}"
        for stage, delay in kills:
            start_and_kill(_args(path, out, tiny_model), out, stage, delay)
            rows = recorded_rows(out)
            assert len(rows) == len(set(rows)), f"seed {seed}: a row committed twice"
            cut_mid_job += 0 < len(rows) < N_ROWS
        assert main(_args(path, out, tiny_model)) == 3, f"seed {seed}"  # resumes; the stale lock is taken
        assert read_jsonl(out / "results.jsonl") == clean_results, f"seed {seed}"
        assert read_jsonl(out / "errors.jsonl") == clean_errors, f"seed {seed}"
        rows = recorded_rows(out)
        assert sorted(rows) == list(range(N_ROWS)), f"seed {seed}"
    assert cut_mid_job, "no kill landed between two commits: the test did not test resume"


def test_sigterm_mid_job_commits_what_is_finished_and_exits_130(tmp_path, tiny_model):
    path = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out, marker = tmp_path / "out", tmp_path / "first-shard-committed"
    with open(tmp_path / "stderr", "w") as stderr:  # a file, not a pipe nobody reads while it runs
        proc = start_until_marker(PAUSE_AFTER_FIRST_SHARD, marker, _args(path, out, tiny_model), stderr)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not (out / "lock").exists()  # released on the way out
    rows = recorded_rows(out)
    assert 0 < len(rows) < N_ROWS and len(rows) == len(set(rows))  # kept what was finished, mid-job
    assert main(_args(path, out, tiny_model)) == 3
    assert sorted(recorded_rows(out)) == list(range(N_ROWS))
