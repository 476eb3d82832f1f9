"""kill -9 in the middle of an embed job (a real subprocess): the rerun finishes it, every row once,
and the vectors equal an uninterrupted run's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
from embed_models import word_texts
from helpers.rows import write_jsonl

import bulkrun
from bulkrun.cli import main

N_ROWS = 40


def _args(path, out, model):
    return ["embed", str(path), "--out", str(out), "--model", str(model), "--id-field", "id", "--dtype", "float32",
            "--checkpoint-every", "4", "--window", "4", "--max-num-seqs", "2", "--quiet"]  # fmt: skip


def _committed_rows(out):
    return [row for shard in sorted((out / "shards").glob("*.parquet"))
            for row in pq.read_table(shard, columns=["row"])["row"].to_pylist()]  # fmt: skip


def test_resume_after_kill_9_gives_the_same_vectors(tmp_path, tiny_bert):
    rows = [
        {"id": f"r{i}", "text": t}
        for i, t in enumerate(word_texts([(i * 7) % 23 + 1 for i in range(N_ROWS)]))
    ]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    assert main(_args(path, tmp_path / "clean", tiny_bert)) == 0
    clean_ids, clean = bulkrun.embeddings(tmp_path / "clean")
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", "from bulkrun.cli import main; main()",
                             *_args(path, out, tiny_bert)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while (
        proc.poll() is None and time.monotonic() < deadline and not list((out / "shards").glob("*.parquet"))
    ):
        time.sleep(0.005)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = _committed_rows(out)
    assert 0 < len(done) < N_ROWS, "the kill did not land mid-job"
    assert main(_args(path, out, tiny_bert)) == 0
    rows_after = _committed_rows(out)
    assert sorted(rows_after) == list(range(N_ROWS))  # every row exactly once
    ids, got = bulkrun.embeddings(out)
    assert ids == clean_ids
    np.testing.assert_allclose(got, clean, rtol=0, atol=1e-6)
