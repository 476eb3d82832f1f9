"""Through the CLI, in bf16 (the CPU default where it is native): a job killed with kill -9 at random
points and resumed gives every row the same tokens as an uninterrupted run. The resumed run batches
its rows with other mates and chunks than the clean one did, so this holds only when the kernels are
batch invariant. A few trials on a tiny model here; the slow variant runs 20 on the default model."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from helpers.models import make_tiny_model
from helpers.processes import start_and_kill
from helpers.rows import read_jsonl, recorded_rows, texts, write_jsonl

from bulkrun.cli import main

KILL_SEED = int(os.environ.get("BULKRUN_KILL_SEED", "20261202"))
# head_dim 32, K a multiple of 32: the AMX linears and the native attention take part
SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


def _flags(max_tokens: int, seqs: int) -> list[str]:
    return ["--id-field", "id", "--max-tokens", str(max_tokens), "--checkpoint-every", "3", "--window", "6",
            "--max-num-seqs", str(seqs), "--max-num-batched-tokens", "64", "--kv-cache-bytes", "32MiB",
            "--dtype", "bfloat16", "--quiet"]  # fmt: skip


def _trials(
    path: Path, tmp: Path, model: str, flags: list[str], trials: int, rows: int, task="generate"
) -> None:
    clean = tmp / "clean"
    assert main([task, str(path), "--out", str(clean), "--model", model, *flags]) == 0
    want = read_jsonl(clean / "results.jsonl")
    rng = random.Random(KILL_SEED)
    for trial in range(trials):
        out = tmp / f"trial{trial}"
        args = [task, str(path), "--out", str(out), "--model", model, *flags]
        for _ in range(rng.randint(1, 2)):
            start_and_kill(args, out, rng.randint(0, 2), rng.uniform(0, 0.5))
        assert main(args) == 0, f"seed {KILL_SEED} trial {trial}"
        got = read_jsonl(out / "results.jsonl")
        differ = [g["id"] for g, w in zip(got, want, strict=True) if g != w]
        assert not differ, f"seed {KILL_SEED} trial {trial}: rows {differ} differ from the clean run"
        assert sorted(recorded_rows(out)) == list(range(rows))


def test_bf16_resume_after_kill_9_equals_a_clean_run(tmp_path):
    """classify: its label probabilities show a difference in the last bits, which a tiny model's
    greedy tokens would mostly hide."""
    model = make_tiny_model(tmp_path / "model", **SHAPE)
    rows = texts(18)
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    flags = [*_flags(1, 4), "--labels", "billing,shipping,returns"]
    _trials(path, tmp_path, str(model), flags, trials=3, rows=len(rows), task="classify")


@pytest.mark.slow
def test_bf16_resume_after_kill_9_on_the_default_model_20_trials(tmp_path):
    from bulkrun.model_source import resolve_model

    # 21 runs of the job: sized for a slow box (2 AVX2 cores, where bf16 is not native and the model
    # computes in fp32, took 855 s of the 900 s timeout with 32 rows of 24 tokens)
    rows = texts(24)
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    _trials(path, tmp_path, str(resolve_model(None)), _flags(16, 8), trials=20, rows=len(rows))
