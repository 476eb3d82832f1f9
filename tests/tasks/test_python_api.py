"""The Python API (bulkrun.run / results / errors / metrics / sweep) on a tiny random model: a job run
in-process with the CLI's semantics, its output read back as pandas DataFrames in input order."""

from __future__ import annotations

import pytest
from helpers.rows import write_jsonl

import bulkrun
from bulkrun.exceptions import JobChanged, LockHeld, UsageError
from bulkrun.io.lock import JobLock

ENGINE = {"kv_cache_bytes": "16MiB", "max_num_seqs": 8, "max_num_batched_tokens": 256, "quiet": True}
ROWS = [
    {"id": "a", "text": "I was charged twice.", "label": "billing"},
    {"id": "b", "text": "The app crashes on start.", "label": "bug"},
    {"id": "c", "text": "", "label": "bug"},  # an empty text: a row error
    {"id": "d", "text": "Where is my parcel?", "label": "billing"},
    {"id": "e", "text": "Refund please.", "label": "billing"},
]


@pytest.fixture
def job(tmp_path, tiny_model_dir):
    source = write_jsonl(tmp_path / "t.jsonl", ROWS)
    spec = {"task": "eval", "input": str(source), "labels": ["billing", "bug"], "model": str(tiny_model_dir)}
    return spec | ENGINE


def test_run_returns_the_report_and_the_readers_give_input_order(job, tmp_path):
    out = tmp_path / "out"
    report = bulkrun.run(job, out=out)
    assert report["complete"] and report["errors_total"] == 1 and report["results_total"] == 4
    results = bulkrun.results(out)
    assert list(results["id"]) == ["a", "b", "d", "e"] and list(results["row"]) == [0, 1, 3, 4]
    assert {"label", "raw_label", "label_probs", "correct"} <= set(results.columns)
    errors = bulkrun.errors(out)
    assert list(errors["id"]) == ["c"] and list(errors["kind"]) == ["empty_text"]
    metrics = bulkrun.metrics(out)
    assert metrics == report["metrics"] and metrics["items"] == 4
    assert metrics["accuracy"] == results["correct"].mean()
    again = bulkrun.run(job, out=out)  # a rerun resumes: nothing left to do
    assert again["complete"] and again["items"] == 0


def test_an_unfinished_job_reads_what_is_committed(job, tmp_path):
    out = tmp_path / "out"
    report = bulkrun.run(job, out=out, shard="1/2")  # one slice: half the rows
    assert not report["complete"]
    results = bulkrun.results(out)
    assert list(results["row"]) == sorted(results["row"]) and 0 < len(results) < 4
    assert bulkrun.metrics(out)["items"] == len(results)  # over the committed results


def test_exit_conditions_are_exceptions(job, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="unknown option 'lables'"):
        bulkrun.run(job, out=out, lables="x")
    bulkrun.run(job, out=out)
    with pytest.raises(JobChanged):
        bulkrun.run(job, out=out, labels=["billing", "bug", "feature"])
    with JobLock(out / "lock"), pytest.raises(LockHeld):
        bulkrun.run(job, out=out, restart=True)


def test_a_spec_file_and_options_and_a_sweep(job, tmp_path, tiny_model_dir):
    spec = tmp_path / "job.toml"
    spec.write_text(f'task = "eval"\ninput = "{job["input"]}"\nlabels = ["billing", "bug"]\n')
    report = bulkrun.run(spec, out=tmp_path / "one", model=tiny_model_dir, **ENGINE)
    assert report["complete"]
    sweep = bulkrun.run(spec, out=tmp_path / "sweep", model=tiny_model_dir, sweep_template=["{text}", "Ticket: {text}"], **ENGINE)  # fmt: skip
    table = bulkrun.sweep(tmp_path / "sweep")
    assert len(table) == 2 == len(sweep["sweep"])
    assert {"accuracy", "raw_accuracy", "acc_norm"} <= set(table.columns)


def test_import_bulkrun_stays_light():
    import subprocess
    import sys

    code = "import sys, bulkrun; bulkrun.errors; print('torch' in sys.modules, 'pandas' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == ["False", "False"]  # fmt: skip


def test_repeated_runs_in_one_process_reuse_the_loaded_model(job, tmp_path, monkeypatch):
    """A notebook's second bulkrun.run with the same model, device and dtype loads nothing and gets
    the same results; another dtype loads the model again."""
    from bulkrun.engine.worker import loaded_model

    monkeypatch.setattr(loaded_model, "_LAST", {})
    loads, load = [], loaded_model._load
    monkeypatch.setattr(loaded_model, "_load", lambda *args: loads.append(load(*args)) or loads[-1])
    used = []
    monkeypatch.setattr(
        loaded_model, "load", lambda *args, real=loaded_model.load: used.append(real(*args)) or used[-1]
    )
    bulkrun.run(job, out=tmp_path / "a", dtype="float32")
    bulkrun.run(job, out=tmp_path / "b", dtype="float32")
    assert len(loads) == 1 and used[0] is used[-1] is loads[0]  # the second job took the first's model
    assert bulkrun.results(tmp_path / "a").equals(bulkrun.results(tmp_path / "b"))
    bulkrun.run(job, out=tmp_path / "c", dtype="bfloat16")
    assert len(loads) == 2 and loads[1] is not loads[0] and used[-1] is loads[1]
