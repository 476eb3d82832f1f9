"""Label scores through the real Engine equal log-probabilities computed directly with transformers,
and do not depend on prefix caching or on which other requests share the batches."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.tasks import chat_prompt_ids, hf_continuation_logprobs, load_hf_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun.tasks.base import Item, TaskContext
from bulkrun.tasks.classify import ClassifyTask
from bulkrun.tasks.labels import LabelSet

LABELS = LabelSet(
    ("billing", "bug", "feature request", "account access", "shipping"),
    {"billing": "payments, invoices, refunds", "shipping": "delivery, parcels, returns"},
)
TEXTS = [
    "I was charged twice for my March subscription.",
    "The app crashes every time I upload a photo larger than 10 MB.",
    "Could you add an option to export projects as PDF?",
    "Hallo, meine Bestellung ist seit zehn Tagen unterwegs.",
    "I forgot my password and the reset email never arrives.",
    "Tracking says delivered but there's nothing at my door.",
]
TOL = 2e-4  # fp32: same math in another summation order


def make_task(tokenizer, max_model_len=2048, normalize="sum"):
    examples = [{"text": "Refund my order please", "label": "billing"}]
    task = ClassifyTask(LABELS, examples=examples, normalize=normalize, calibrate="none")
    task.bind(TaskContext(tokenizer=tokenizer, max_model_len=max_model_len, sampling=SamplingParams()))
    return task


def score_requests(task, tokenizer, texts, prefix="i"):
    requests = []
    for i, text in enumerate(texts):
        item = Item(i, str(i), {"text": text})
        (req,) = task.requests(item, chat_prompt_ids(tokenizer, task.render(item)))
        req.request_id = f"{prefix}{i}"
        requests.append(req)
    return requests


def engine_for(model_dir, **config):
    return load_engine(str(model_dir), EngineConfig(kv_cache_bytes=32 << 20, dtype="float32", **config))


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    return engine_for(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_reference(tiny_model_dir, tokenizer):
    task = make_task(tokenizer)
    model = load_hf_model(tiny_model_dir)
    return [
        hf_continuation_logprobs(model, r.prompt_token_ids, r.continuations)
        for r in score_requests(task, tokenizer, TEXTS)
    ]


def test_label_logprobs_equal_transformers(tiny_engine, tiny_reference, tokenizer):
    task = make_task(tokenizer)
    requests = score_requests(task, tokenizer, TEXTS)
    assert any(len(c) > 1 for c in requests[0].continuations)  # multi-token labels
    outputs = tiny_engine.generate(requests)
    for out, ref in zip(outputs, tiny_reference, strict=True):
        assert out.finish_reason == "scored"
        assert [len(c) for c in out.continuation_logprobs] == [len(c) for c in ref]
        for got, want in zip(out.continuation_logprobs, ref, strict=True):
            assert got == pytest.approx(want, abs=TOL)
        columns = task.label_columns(out)
        assert list(columns["label_scores"].values()) == pytest.approx([sum(r) for r in ref], abs=TOL * 4)


def test_prefix_cache_on_and_off_give_the_same_scores(tiny_model_dir, tiny_reference, tokenizer):
    task = make_task(tokenizer)
    results = {}
    for cache in (True, False):
        engine = engine_for(tiny_model_dir, enable_prefix_caching=cache)
        outputs = []
        for req in score_requests(task, tokenizer, TEXTS):  # one at a time: later items can hit the cache
            outputs += engine.generate([req])
        results[cache] = outputs
    assert sum(o.num_cached_tokens for o in results[True]) >= len(task.instruction) // 8
    assert all(o.num_cached_tokens == 0 for o in results[False])
    for on, off, ref in zip(results[True], results[False], tiny_reference, strict=True):
        for a, b, want in zip(on.continuation_logprobs, off.continuation_logprobs, ref, strict=True):
            assert a == pytest.approx(b, abs=TOL) and a == pytest.approx(want, abs=TOL)


def test_scores_do_not_depend_on_batch_composition(tiny_model_dir, tiny_reference, tokenizer):
    """Alone, all together, in reverse, interleaved with generation requests, and with a token
    budget so small that prompts arrive in chunks across steps."""
    task = make_task(tokenizer)
    alone = [engine_for(tiny_model_dir).generate([r])[0] for r in score_requests(task, tokenizer, TEXTS[:2])]
    engine = engine_for(tiny_model_dir, max_num_batched_tokens=48, max_num_seqs=5)
    mixed = list(reversed(score_requests(task, tokenizer, TEXTS, prefix="s")))
    gen_params = SamplingParams(max_tokens=5, ignore_eos=True)
    for i, text in enumerate(TEXTS[:3]):
        mixed.insert(2 * i, EngineRequest(f"g{i}", chat_prompt_ids(tokenizer, text), gen_params))
    by_id = {o.request_id: o for o in engine.generate(mixed)}
    assert all(len(by_id[f"g{i}"].output_token_ids) == 5 for i in range(3))
    for i, ref in enumerate(tiny_reference):
        together = by_id[f"s{i}"].continuation_logprobs
        for got, want in zip(together, ref, strict=True):
            assert got == pytest.approx(want, abs=TOL)
        if i < len(alone):
            for got, want in zip(together, alone[i].continuation_logprobs, strict=True):
                assert got == pytest.approx(want, abs=TOL)


@pytest.mark.slow
def test_default_model_label_scores_equal_transformers(default_model_dir, tokenizer):
    task = make_task(tokenizer)
    requests = score_requests(task, tokenizer, TEXTS[:2])
    outputs = engine_for(default_model_dir).generate(requests)
    model = load_hf_model(default_model_dir)
    for req, out in zip(requests, outputs, strict=True):
        ref = hf_continuation_logprobs(model, req.prompt_token_ids, req.continuations)
        for got, want in zip(out.continuation_logprobs, ref, strict=True):
            assert got == pytest.approx(want, abs=TOL)
        # the chosen label is the one transformers' own scores choose
        assert (
            task.label_columns(out)["label"]
            == task.label_columns(replace(out, continuation_logprobs=ref))["label"]
        )
