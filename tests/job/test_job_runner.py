"""run_job on the FakeEngine: order, bad rows, --n seeds, resume after a crash, changed jobs."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.fake_engine import FakeEngine
from helpers.rows import read_jsonl, texts, write_jsonl

from bulkrun.exceptions import JobChanged, LockHeld
from bulkrun.io.lock import JobLock


def test_results_come_back_in_input_order_with_outputs(tmp_path, run_fake, byte_tokenizer):
    path = write_jsonl(tmp_path / "in.jsonl", texts(50))
    engine = FakeEngine(byte_tokenizer)  # finishes requests in a scrambled order
    report = run_fake(engine, input=str(path), out=str(tmp_path / "out"), id_field="id", window=8,
                      checkpoint_every="7")  # fmt: skip
    results = read_jsonl(tmp_path / "out" / "results.jsonl")
    assert [r["id"] for r in results] == [f"r{i}" for i in range(50)]
    assert [r["row"] for r in results] == list(range(50))
    first = results[0]
    assert set(first) >= {"text", "finish_reason", "prompt_tokens", "generated_tokens"}
    assert first["prompt_tokens"] > 0 and first["generated_tokens"] == 4
    assert report["complete"] and report["results_total"] == 50 and report["errors_total"] == 0
    assert len(list((tmp_path / "out" / "shards").glob("*.parquet"))) >= 5  # checkpointed along the way
    assert engine.added == 50


BAD_ROWS = [
    ({"id": "good0", "text": "fine"}, None),
    ('{"id": "x", "text": ', "malformed_json"),
    ({"id": "nofield"}, "missing_field"),
    ({"id": "num", "text": 42}, "not_a_string"),
    ({"id": "empty", "text": "   "}, "empty_text"),
    ({"id": "surrogate", "text": "bad \ud800 text"}, "invalid_utf8"),
    ({"id": "long", "text": "x" * 600}, "prompt_too_long"),
    ({"id": "good0", "text": "same id again"}, "duplicate_id"),
    ({"text": "no id"}, "missing_id"),
    ({"id": "good1", "text": "also fine"}, None),
]


def test_every_bad_row_kind_becomes_an_error_record_and_good_rows_finish(tmp_path, run_fake):
    path = tmp_path / "in.jsonl"
    write_jsonl(path, [row for row, _ in BAD_ROWS])
    with open(path, "ab") as f:
        f.write(b'{"id": "utf8", "text": "\xff\xfe"}\n')
    report = run_fake(input=str(path), out=str(tmp_path / "out"), id_field="id")
    results = read_jsonl(tmp_path / "out" / "results.jsonl")
    errors = read_jsonl(tmp_path / "out" / "errors.jsonl")
    assert [r["id"] for r in results] == ["good0", "good1"]
    expected = [(row, kind) for row, (_, kind) in enumerate(BAD_ROWS) if kind] + [(10, "invalid_utf8")]
    assert [(e["row"], e["kind"]) for e in errors] == expected
    assert all(e["message"] for e in errors)
    assert report["complete"] and report["errors_total"] == 9


def test_template_field_missing_is_a_row_error(tmp_path, run_fake):
    path = write_jsonl(tmp_path / "in.jsonl", [{"topic": "cats", "style": "haiku"}, {"topic": "dogs"}])
    run_fake(input=str(path), out=str(tmp_path / "out"), prompt_template="Write a {style} about {topic}.")
    errors = read_jsonl(tmp_path / "out" / "errors.jsonl")
    assert [(e["row"], e["kind"]) for e in errors] == [(1, "template_field_missing")]
    assert "style" in errors[0]["message"]


def test_n_samples_get_distinct_reproducible_seeds_independent_of_windows(tmp_path, run_fake):
    path = write_jsonl(tmp_path / "in.jsonl", texts(12))
    common = dict(input=str(path), id_field="id", n=3, temperature=0.8, seed=7)
    run_fake(out=str(tmp_path / "a"), window=4, **common)
    run_fake(out=str(tmp_path / "b"), window=100, sort_by_length=False, **common)
    a = read_jsonl(tmp_path / "a" / "results.jsonl")
    b = read_jsonl(tmp_path / "b" / "results.jsonl")
    assert a == b
    assert all(len(r["text"]) == 3 and len(set(r["text"])) == 3 for r in a)
    run_fake(out=str(tmp_path / "c"), **(common | {"seed": 8}))
    assert read_jsonl(tmp_path / "c" / "results.jsonl") != a


class CrashingEngine(FakeEngine):
    """Dies (like a killed process would) after a number of steps."""

    def __init__(self, tokenizer, crash_after: int):
        super().__init__(tokenizer)
        self.crash_after = crash_after

    def step(self):
        if self.steps >= self.crash_after:
            raise RuntimeError("simulated crash")
        return super().step()


def test_resume_after_a_crash_is_exactly_once_and_equals_a_clean_run(tmp_path, run_fake, byte_tokenizer):
    rows = texts(40)
    rows[5] = {"id": "r5", "text": ""}  # an error record must also be committed exactly once
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    common = dict(input=str(path), id_field="id", window=6, checkpoint_every="5")
    run_fake(out=str(tmp_path / "clean"), **common)
    out = tmp_path / "resumed"
    for crash_after in (3, 6):
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_fake(CrashingEngine(byte_tokenizer, crash_after), out=str(out), **common)
    engine = FakeEngine(byte_tokenizer)
    report = run_fake(engine, out=str(out), **common)
    assert engine.added < 39  # the rerun did only what was left
    assert report["complete"] and report["done"] == 40
    assert read_jsonl(out / "results.jsonl") == read_jsonl(tmp_path / "clean" / "results.jsonl")
    assert read_jsonl(out / "errors.jsonl") == read_jsonl(tmp_path / "clean" / "errors.jsonl")
    rows_in_shards = [
        r for p in sorted((out / "shards").glob("*.parquet")) for r in pq.read_table(p)["row"].to_pylist()
    ]
    assert sorted(rows_in_shards) == sorted(set(rows_in_shards))  # no row committed twice


def test_a_finished_job_rerun_does_nothing(tmp_path, run_fake, byte_tokenizer):
    path = write_jsonl(tmp_path / "in.jsonl", texts(5))
    run_fake(input=str(path), out=str(tmp_path / "out"))
    engine = FakeEngine(byte_tokenizer)
    report = run_fake(engine, input=str(path), out=str(tmp_path / "out"))
    assert engine.added == 0 and report["complete"] and report["items"] == 0


def test_a_changed_job_is_refused_unless_restart(tmp_path, run_fake):
    path = write_jsonl(tmp_path / "in.jsonl", texts(5))
    out = str(tmp_path / "out")
    run_fake(input=str(path), out=out, temperature=0.0)
    with pytest.raises(JobChanged, match="temperature"):
        run_fake(input=str(path), out=out, temperature=0.5)
    write_jsonl(path, texts(6))
    with pytest.raises(JobChanged, match="input changed"):
        run_fake(input=str(path), out=out)
    report = run_fake(input=str(path), out=out, temperature=0.5, restart=True)
    assert report["complete"] and report["results_total"] == 6


def test_an_option_added_since_the_job_began_is_no_change_while_unset(tmp_path, run_fake):
    import json

    path = write_jsonl(tmp_path / "in.jsonl", texts(5))
    out = tmp_path / "out"
    run_fake(input=str(path), out=str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["spec"]["an_older_option"] = None  # as if an option had been removed since
    del manifest["spec"]["system"]  # as if --system had been added since (unset: None)
    manifest["spec_fingerprint"] = "from-an-older-release"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert run_fake(input=str(path), out=str(out))["complete"]
    with pytest.raises(JobChanged, match="system"):
        run_fake(input=str(path), out=str(out), system="Be brief.")


def test_engine_knobs_and_window_may_change_on_resume(tmp_path, run_fake):
    path = write_jsonl(tmp_path / "in.jsonl", texts(5))
    out = str(tmp_path / "out")
    run_fake(input=str(path), out=out, window=2)
    report = run_fake(input=str(path), out=out, window=64, max_num_seqs=4, checkpoint_every="1s")
    assert report["complete"]


def test_a_live_lock_blocks_a_second_run(tmp_path, run_fake):
    path = write_jsonl(tmp_path / "in.jsonl", texts(3))
    out = tmp_path / "out"
    out.mkdir()
    with JobLock(out / "lock"), pytest.raises(LockHeld, match="in use by pid"):
        run_fake(input=str(path), out=str(out))
    assert run_fake(input=str(path), out=str(out))["complete"]  # released: runs now


def test_parquet_input_gives_parquet_results_and_csv_works(tmp_path, run_fake):
    pq.write_table(pa.table({"text": ["a b", "c d e", "f"]}), tmp_path / "in.parquet")
    run_fake(input=str(tmp_path / "in.parquet"), out=str(tmp_path / "p"))
    table = pq.read_table(tmp_path / "p" / "results.parquet")
    assert table["id"].to_pylist() == ["0", "1", "2"] and table.num_rows == 3
    (tmp_path / "in.csv").write_text("key,body\nk1,hello there\nk2,general kenobi\n")
    run_fake(input=str(tmp_path / "in.csv"), out=str(tmp_path / "c"), id_field="key", text_field="body")
    table = pq.read_table(tmp_path / "c" / "results.parquet")
    assert table["id"].to_pylist() == ["k1", "k2"]


def test_keep_fields_copies_input_columns(tmp_path, run_fake):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "hi", "lang": "en"}])
    run_fake(input=str(path), out=str(tmp_path / "out"), keep_fields=["lang", "text"])
    (record,) = read_jsonl(tmp_path / "out" / "results.jsonl")
    assert record["lang"] == "en" and record["input_text"] == "hi"
