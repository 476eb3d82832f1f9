"""ClassifyTask logic against a transformers-backed stand-in engine (the real engine: test_classify_engine)."""

from __future__ import annotations

import math

import pytest
from helpers.tasks import ReferenceEngine, chat_prompt_ids, load_hf_model, run_items

from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.core.params import SamplingParams
from bulkrun.tasks.base import Item, RowError, TaskContext
from bulkrun.tasks.calibration import argmax, calibrate, normalized_probs
from bulkrun.tasks.classify import ClassifyTask
from bulkrun.tasks.labels import LabelError

ROWS = [
    {"id": "a", "text": "I was charged twice this month."},
    {"id": "b", "text": "The app crashes when I upload a photo."},
    {"id": "c", "text": "Please add dark mode."},
]
OPTIONS = {
    "labels": "billing,bug,feature request",
    "label_descriptions": {"billing": "payments and invoices"},
    "examples": [{"text": "Refund my  order", "label": "Billing"}],
}


def make_task(tokenizer, **options):
    task = ClassifyTask.from_options({**ClassifyTask.options, **OPTIONS, **options})
    task.bind(TaskContext(tokenizer=tokenizer, max_model_len=2048, sampling=SamplingParams()))
    return task


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_hf_model(tiny_model_dir)


def test_instruction_comes_first_and_is_a_shared_token_prefix(tokenizer):
    task = make_task(tokenizer)
    prompts = [task.render(Item(i, str(i), row)) for i, row in enumerate(ROWS)]
    assert all(p.startswith(task.instruction) for p in prompts)
    assert "- billing: payments and invoices" in task.instruction
    assert "Text: Refund my order\nLabel: billing" in task.instruction  # example label made canonical
    ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
    shared = next(i for i, toks in enumerate(zip(*ids, strict=False)) if len(set(toks)) > 1)
    assert shared >= len(tokenizer(task.instruction, add_special_tokens=False)["input_ids"])


def test_label_columns_follow_the_reference_scores(tokenizer, tiny_model):
    task = make_task(tokenizer)
    results = run_items(task, tokenizer, ReferenceEngine(tiny_model), ROWS)
    for row, result in zip(ROWS, results, strict=True):
        prompt_ids = chat_prompt_ids(tokenizer, task.render(Item(0, "x", row)))
        conts = task.continuations(prompt_ids)
        assert len(conts[2]) > 1  # "feature request" is a multi-token label
        expected = [
            sum(lp)
            for lp in ReferenceEngine(tiny_model)
            .run(task.requests(None, prompt_ids)[0])
            .continuation_logprobs
        ]
        assert list(result["label_scores"].values()) == pytest.approx(expected, abs=1e-6)
        raw = list(result["raw_label_probs"].values())
        assert raw == pytest.approx(normalized_probs(expected))
        assert result["raw_label"] == ("billing", "bug", "feature request")[argmax(expected)]
        # the label is the argmax of the raw probabilities divided by the content-free prior
        prior = list(result["label_prior"].values())
        probs = list(result["label_probs"].values())
        assert sum(probs) == pytest.approx(1.0) and probs == pytest.approx(calibrate(raw, prior))
        assert result["label"] == ("billing", "bug", "feature request")[argmax(probs)]
        assert result["probability"] == pytest.approx(max(probs))


def test_mean_normalisation_divides_by_label_length(tokenizer):
    task = make_task(tokenizer, normalize="mean", calibrate="none")
    out = RequestOutput(
        "score", [1], finish_reason="scored", continuation_logprobs=[[-1.0], [-0.5], [-1.0, -2.0]]
    )
    columns = task.label_columns(out)
    assert columns["label_scores"] == {"billing": -1.0, "bug": -0.5, "feature request": -1.5}
    assert columns["label"] == "bug"
    total = math.exp(-1.0) + math.exp(-0.5) + math.exp(-1.5)
    assert columns["probability"] == pytest.approx(math.exp(-0.5) / total)


def test_ties_go_to_the_first_listed_label(tokenizer):
    task = make_task(tokenizer, calibrate="none")
    out = RequestOutput(
        "s", [1], finish_reason="scored", continuation_logprobs=[[-2.0], [-1.0], [-0.5, -0.5]]
    )
    assert task.label_columns(out)["label"] == "bug"


def test_engine_error_becomes_a_row_error(tokenizer):
    task = make_task(tokenizer)
    with pytest.raises(RowError, match="too long"):
        task.label_columns(RequestOutput("s", [1], finish_reason="error", error="prompt too long"))


def test_prompt_plus_label_longer_than_context_is_a_row_error(tokenizer):
    task = ClassifyTask.from_options({**ClassifyTask.options, **OPTIONS})
    task.bind(TaskContext(tokenizer=tokenizer, max_model_len=32, sampling=SamplingParams()))
    item = Item(0, "0", ROWS[0])
    with pytest.raises(RowError) as info:
        task.requests(item, chat_prompt_ids(tokenizer, task.render(item)))
    assert info.value.kind == "prompt_too_long"


def test_bad_options_are_refused(tokenizer):
    with pytest.raises(ValueError, match="normalize must be one of sum, mean"):
        make_task(tokenizer, normalize="max")
    with pytest.raises(LabelError, match="example 1 has label 'refund'"):
        make_task(tokenizer, examples=[{"text": "x", "label": "refund"}])
    with pytest.raises(LabelError, match="at least two labels"):
        make_task(tokenizer, labels="billing")
    with pytest.raises(LabelError, match="duplicate label"):
        make_task(tokenizer, labels="bug,billing,Bug")


def test_summary_counts_labels(tokenizer):
    task = make_task(tokenizer)
    summary = task.summarize([{"label": "bug"}, {"label": "bug"}, {"label": "billing"}])
    assert summary["label_counts"] == {"billing": 1, "bug": 2, "feature request": 0}


def _encode(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_answer_is_begun_so_labels_get_their_in_text_tokens(tokenizer):
    task = make_task(tokenizer)
    item = Item(0, "0", ROWS[0])
    prompt_ids = chat_prompt_ids(tokenizer, task.render(item))
    (req,) = task.requests(item, prompt_ids)
    prompt_text = tokenizer.decode(prompt_ids)
    assert prompt_text.endswith("assistant\n")
    assert req.prompt_token_ids == _encode(tokenizer, prompt_text + "Label:")
    assert req.continuations[0] == _encode(tokenizer, " billing")
    for label, cont in zip(task.labels, req.continuations, strict=True):
        assert req.prompt_token_ids + cont == _encode(tokenizer, prompt_text + "Label: " + label)


def test_raw_prompt_gets_the_answer_prefix_on_a_new_line(tokenizer):
    task = make_task(tokenizer)
    item = Item(0, "0", ROWS[1])
    text = task.render(item)
    (req,) = task.requests(item, _encode(tokenizer, text))
    assert tokenizer.decode(req.prompt_token_ids) == text + "\nLabel:"


def test_empty_answer_prefix_scores_labels_right_after_the_prompt(tokenizer):
    task = make_task(tokenizer, answer_prefix="")
    item = Item(0, "0", ROWS[0])
    prompt_ids = chat_prompt_ids(tokenizer, task.render(item))
    (req,) = task.requests(item, prompt_ids)
    assert req.prompt_token_ids == prompt_ids
    assert req.continuations[0] == _encode(tokenizer, "billing")
