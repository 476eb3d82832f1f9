"""`bulkrun embed` through the CLI on a tiny BERT: --shard slices merged by export equal one run,
`bulkrun plan` on an encoder, bad flags stop before any work."""

from __future__ import annotations

import numpy as np
from embed_models import word_texts
from helpers.rows import write_jsonl

import bulkrun
from bulkrun.cli import main
from bulkrun.exceptions import EXIT_USAGE


def _input(tmp_path, n=12):
    rows = [
        {"id": f"r{i}", "text": t} for i, t in enumerate(word_texts([i % 9 + 1 for i in range(n)], seed=5))
    ]
    return write_jsonl(tmp_path / "in.jsonl", rows)


def test_shards_merge_to_the_single_run(tmp_path, tiny_bert):
    path, flags = _input(tmp_path), ["--model", str(tiny_bert), "--dtype", "float32", "-q"]
    assert main(["embed", str(path), "--out", str(tmp_path / "one"), *flags]) == 0
    for k in range(3):
        assert main(["embed", str(path), "--out", str(tmp_path / "split"), "--shard", f"{k}/3", *flags]) == 0
    assert main(["export", str(tmp_path / "split")]) == 0
    ids, whole = bulkrun.embeddings(tmp_path / "one")
    split_ids, split = bulkrun.embeddings(tmp_path / "split")
    assert split_ids == ids == [f"r{i}" for i in range(12)]
    np.testing.assert_allclose(split, whole, rtol=0, atol=1e-6)


def test_plan_on_an_encoder(tmp_path, tiny_bert, capsys):
    path = _input(tmp_path)
    assert (
        main(["plan", str(path), "--task", "embed", "--model", str(tiny_bert), "--dtype", "float32", "-q"])
        == 0
    )
    out = capsys.readouterr().out
    assert "rows              12" in out and "at most 0" in out  # nothing is generated


def test_bad_flags_stop_before_any_work(tmp_path, tiny_bert, capsys):
    path = _input(tmp_path)
    for bad in (["--normalize", "cosine"], ["--pooling", "max"], ["--embedding-dtype", "int8"],
                ["--query-prompt", "q: ", "--prompt-name", "query"], ["--max-length", "0"]):  # fmt: skip
        out = tmp_path / "out"
        assert main(["embed", str(path), "--out", str(out), "--model", str(tiny_bert), *bad]) == EXIT_USAGE, (
            bad
        )
        assert not (out / "shards").exists()
    assert "--normalize" in capsys.readouterr().err
