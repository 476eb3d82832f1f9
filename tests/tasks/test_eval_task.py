"""EvalTask: expected answers, per-item correctness, classify-style and generation suites."""

from __future__ import annotations

import pytest
from helpers.tasks import ReferenceEngine, load_hf_model, run_items

from bulkrun.engine.core.params import SamplingParams
from bulkrun.tasks.base import Item, RowError, TaskContext
from bulkrun.tasks.eval import EvalTask


def make_task(tokenizer, **options):
    task = EvalTask.from_options({**EvalTask.options, **options})
    task.bind(TaskContext(tokenizer=tokenizer, max_model_len=2048, sampling=SamplingParams(seed=3)))
    return task


def test_classify_suite_marks_items_and_computes_metrics(tokenizer, tiny_model_dir):
    task = make_task(tokenizer, labels=["billing", "bug"])
    rows = [
        {"text": "charged twice", "label": "billing"},
        {"text": "crash on start", "label": "BUG"},
        {"text": "refund please", "label": "billing"},
    ]
    results = run_items(task, tokenizer, ReferenceEngine(load_hf_model(tiny_model_dir)), rows)
    assert [r["expected"] for r in results] == ["billing", "bug", "billing"]
    for r in results:
        assert r["correct"] == (r["predicted"] == r["expected"]) and r["predicted"] == r["label"]
    metrics = task.summarize(results)
    assert metrics["items"] == 3 and metrics["correct"] == sum(r["correct"] for r in results)
    assert sum(sum(row.values()) for row in metrics["confusion"].values()) == 3


def test_rows_without_a_usable_expected_answer_fail_before_engine_work(tokenizer):
    task = make_task(tokenizer, labels="billing,bug")
    for fields, kind in [
        ({"text": "x"}, "missing_expected"),
        ({"text": "x", "label": "  "}, "missing_expected"),
        ({"text": "x", "label": "refund"}, "unknown_label"),
        ({"text": "x", "label": ["bug"]}, "bad_expected"),
    ]:
        with pytest.raises(RowError) as info:
            task.render(Item(0, "0", fields))
        assert info.value.kind == kind


def test_generation_suite_with_answer_regex(tokenizer):
    task = make_task(tokenizer, answer_regex=r"answer is (\d+)")
    assert task.expected_field == "answer"
    texts = {"answer": "Let me think. The answer is 12."}
    results = run_items(task, tokenizer, ReferenceEngine(None, texts), [{"text": "6+6?", "answer": 12}])
    assert results[0]["predicted"] == "12" and results[0]["correct"] is True
    assert results[0]["text"] == texts["answer"]
    texts["answer"] = "I don't know"
    results += run_items(task, tokenizer, ReferenceEngine(None, texts), [{"text": "1+1?", "answer": "2"}])
    assert results[1]["predicted"] is None and results[1]["correct"] is False
    metrics = task.summarize(results)
    assert metrics["accuracy"] == 0.5 and metrics["no_answer"] == 1


def test_generation_suite_exact_and_normalized_match(tokenizer):
    rows = [{"text": "Capital of France?", "answer": "Paris"}]
    engine = ReferenceEngine(None, {"answer": " paris\n"})
    exact = make_task(tokenizer)
    assert run_items(exact, tokenizer, engine, rows)[0]["correct"] is False
    loose = make_task(tokenizer, match="normalized")
    assert run_items(loose, tokenizer, engine, rows)[0]["correct"] is True


def test_generation_requests_are_seeded_from_the_item_not_the_batch(tokenizer):
    task = make_task(tokenizer, expected_field="gold")
    item = Item(5, "q5", {"text": "hi", "gold": "x"})
    first = task.requests(item, [1, 2, 3])[0]
    again = task.requests(Item(9, "q5", item.fields), [1, 2, 3])[0]
    other = task.requests(Item(5, "q6", item.fields), [1, 2, 3])[0]
    assert first.params.seed == again.params.seed != other.params.seed
    assert first.continuations is None and first.params.max_tokens == SamplingParams().max_tokens


def test_bad_eval_options_are_refused(tokenizer):
    with pytest.raises(ValueError, match="not a valid regular expression"):
        make_task(tokenizer, answer_regex="(unclosed")
    with pytest.raises(ValueError, match="at most one"):
        make_task(tokenizer, answer_regex=r"(\d+) (\d+)")
    with pytest.raises(ValueError, match="match must be one of"):
        make_task(tokenizer, match="fuzzy")
    with pytest.raises(ValueError, match="need labels"):
        make_task(tokenizer, examples=[{"text": "x", "label": "y"}])
    with pytest.raises(ValueError, match="generation suites"):
        make_task(tokenizer, labels="a,b", answer_regex="x")
