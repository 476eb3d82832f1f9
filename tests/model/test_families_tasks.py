"""The tasks beyond free generation on every family beyond Llama, through the whole engine (fp32, on
the reference and on the CPU native kernels), against transformers' fp32 forward:
- label scoring (classify, calibrated as by default): each label's log-probability, summed over its
  several tokens, equals the log-softmax sum of transformers' forward over prompt + label, for the
  items and the content-free prompts, and the task's calibrated and raw labels and probabilities are
  those it gives on transformers' scores;
- multiple choice: the log-likelihoods, the chosen option, acc and acc_norm are those of
  lm-evaluation-harness's recipe with transformers;
- constrained decoding: a JSON schema, a regex and a choice list give valid outputs whose tokens are
  transformers' greedy under the same grammar mask, in a batch with free rows.
Every prompt is longer than the sliding window, and arrives in chunks (a small token budget)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.constraints import PROMPTS, hf_masked_greedy, specs
from helpers.models import build_tiny_model
from helpers.multiple_choice import ROWS, hf_choice_loglikelihoods, hf_loglikelihood, lm_eval_acc
from helpers.tasks import chat_prompt_ids

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun.engine.structured_output.grammar import GrammarCache, GrammarTokenizer
from bulkrun.engine.structured_output.output import check_output
from bulkrun.tasks.base import Item, TaskContext
from bulkrun.tasks.calibration import argmax
from bulkrun.tasks.classify import ClassifyTask
from bulkrun.tasks.labels import LabelSet
from bulkrun.tasks.multiple_choice import MultipleChoice, parse_row
from bulkrun_kernels import cpu_build

FAMILIES = ["gemma2", "gemma3", "qwen3_moe", "qwen2_moe", "mixtral", "phi3", "gpt_oss"]
TOL = 1e-4  # fp32 sums of a few log-probabilities, in another summation order
LABELS = LabelSet(("billing", "bug", "feature request"))  # bytes: 8, 4 and 16 tokens after `Label:`
TEXTS = ["I was charged twice.", "The app crashes whenever I upload a photo."]
CHOICE_ROWS = [row for row in ROWS[:5] if row["question"]]  # the rows lm-eval and bulkrun both score
CONSTRAINED = ("enums", "regex", "choice")  # outputs of bounded length: a random model stops in time
MAX_TOKENS = 48
MAX_MODEL_LEN = 256  # the families' context


@dataclass
class Family:
    """One family's tiny model, the requests of each task, and transformers' answers to them."""

    folder: Path
    hf: object
    tokenizer: object
    labels: list[EngineRequest] = field(default_factory=list)  # the content-free prompts', then TEXTS'
    label_refs: list[list[float]] = field(default_factory=list)  # per request, per label: the sum
    choice_refs: list[list[float]] = field(default_factory=list)  # per CHOICE_ROWS row, per choice
    masked_greedy: dict[str, list[int]] = field(default_factory=dict)  # per constraint


def bound(task, tokenizer):
    task.bind(TaskContext(tokenizer=tokenizer, max_model_len=MAX_MODEL_LEN, sampling=SamplingParams()))
    return task


def classify_task(tokenizer) -> ClassifyTask:
    return bound(ClassifyTask(LABELS, instruction="Pick a label."), tokenizer)


def label_requests(tokenizer) -> list[EngineRequest]:
    """As the job layer makes them: the content-free prompts' (calibration) first, then the items'."""
    task = classify_task(tokenizer)
    items = [Item(number, str(number), {"text": text}) for number, text in enumerate(TEXTS)]
    prompts = task.content_free_prompts() + [task.render(item) for item in items]
    requests = []
    for number, prompt in enumerate(prompts):
        (request,) = task.requests(Item(number, str(number), {}), chat_prompt_ids(tokenizer, prompt))
        request.request_id = str(number)
        requests.append(request)
    return requests


def label_columns(task: ClassifyTask, outputs) -> list[dict]:
    """The items' columns, calibrated on the content-free prompts' outputs."""
    content_free = len(task.content_free_inputs)
    task.set_content_free(outputs[:content_free])
    return [task.label_columns(out) for out in outputs[content_free:]]


def choice_requests(task) -> list[EngineRequest]:
    requests = []
    for number, fields in enumerate(CHOICE_ROWS):
        (request,) = task.requests(fields)
        request.request_id = str(number)
        requests.append(request)
    return requests


def constrained_requests(tokenizer) -> list[EngineRequest]:
    rows = specs()
    return [
        EngineRequest(name, chat_prompt_ids(tokenizer, PROMPTS[name]),
                      SamplingParams(max_tokens=MAX_TOKENS, constraint=rows[name]))
        for name in CONSTRAINED
    ]  # fmt: skip


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory) -> Family:
    """Built, and answered by transformers, once for both kernels."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp(request.param)
    hf = build_tiny_model(request.param, folder, text_tokenizer=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    fam = Family(folder, hf, tokenizer, label_requests(tokenizer))
    fam.label_refs = [
        [hf_loglikelihood(hf, r.prompt_token_ids, c) for c in r.continuations] for r in fam.labels
    ]
    fam.choice_refs = [hf_choice_loglikelihoods(hf, tokenizer, row["question"], row["choices"])
                       for row in CHOICE_ROWS]  # fmt: skip
    eos = tokenizer.eos_token_id
    cache = GrammarCache(GrammarTokenizer.from_hf(tokenizer, hf.config.vocab_size, [eos]))
    for r in constrained_requests(tokenizer):
        fam.masked_greedy[r.request_id] = hf_masked_greedy(
            hf, cache, r.params.constraint, r.prompt_token_ids, eos, MAX_TOKENS
        )
    return fam


@pytest.fixture(scope="module", params=["reference", "cpu"])
def engine(family, request):
    if request.param == "cpu" and not cpu_build.load():
        pytest.skip(f"CPU native kernels unavailable: {cpu_build.load_error()}")
    config = EngineConfig(dtype="float32", kernels=request.param, max_num_batched_tokens=40, max_num_seqs=4,
                          kv_cache_bytes=8 << 20, max_model_len=MAX_MODEL_LEN)  # fmt: skip
    return load_engine(str(family.folder), config)


def longer_than_window(fam: Family, requests) -> bool:
    window = getattr(fam.hf.config, "sliding_window", None) or 0
    return min(len(r.prompt_token_ids) for r in requests) > window


def test_label_scores_equal_transformers(family, engine):
    requests = label_requests(family.tokenizer)
    assert all(len(c) > 1 for r in requests for c in r.continuations) and longer_than_window(family, requests)
    outputs = engine.generate(requests)
    for request, output, want in zip(requests, outputs, family.label_refs, strict=True):
        assert [len(lps) for lps in output.continuation_logprobs] == [len(c) for c in request.continuations]
        assert [sum(lps) for lps in output.continuation_logprobs] == pytest.approx(want, abs=TOL)
    hf_outputs = [RequestOutput(r.request_id, r.prompt_token_ids, finish_reason="scored",
                                continuation_logprobs=[[score] for score in scores])
                  for r, scores in zip(requests, family.label_refs, strict=True)]  # fmt: skip
    got = label_columns(classify_task(family.tokenizer), outputs)
    want = label_columns(classify_task(family.tokenizer), hf_outputs)
    for columns, expected in zip(got, want, strict=True):
        assert (columns["label"], columns["raw_label"]) == (expected["label"], expected["raw_label"])
        assert list(columns["label_probs"].values()) == pytest.approx(
            list(expected["label_probs"].values()), abs=TOL
        )


def test_multiple_choice_picks_what_transformers_scores_pick(family, engine):
    task = bound(MultipleChoice("choices", "answer", context_field="question"), family.tokenizer)
    requests = choice_requests(task)
    assert longer_than_window(family, requests)
    outputs = engine.generate(requests)
    for fields, output, want in zip(CHOICE_ROWS, outputs, family.choice_refs, strict=True):
        columns = task.result(fields, output)
        assert columns["loglikelihoods"] == pytest.approx(want, abs=TOL)
        assert columns["predicted_index"] == argmax(want)
        gold = parse_row(fields, "choices", "answer").gold
        assert (columns["correct"], columns["correct_norm"]) == lm_eval_acc(want, fields["choices"], gold)


def test_constrained_greedy_is_transformers_greedy_under_the_mask(family, engine):
    """The constrained rows share their steps with free rows, which are decoding while their
    prompts arrive: transformers decoded each row alone."""
    tokenizer = family.tokenizer
    constrained = constrained_requests(tokenizer)
    assert longer_than_window(family, constrained)
    free = [EngineRequest(f"free{i}", chat_prompt_ids(tokenizer, text), SamplingParams(max_tokens=12))
            for i, text in enumerate(TEXTS)]  # fmt: skip
    outputs = engine.generate([free[0], *constrained, free[1]])[1:-1]
    rows = specs()
    for out in outputs:
        name = out.request_id
        check = check_output(rows[name], out.text, out.finish_reason)
        assert check.ok and out.finish_reason == "stop", (name, out.text, check.message)
        assert out.output_token_ids == family.masked_greedy[name]
