"""Helpers for the task tests: the job layer's default prompt rendering and a transformers reference
scorer for continuation log-probabilities."""

from __future__ import annotations

import copy

import torch

from bulkrun.tasks.base import Item


def load_hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """The prompt ids the job layer's PromptBuilder makes for `text` (one user message, chat template)."""
    from bulkrun.job.feed import PromptBuilder

    class _Text:
        def render(self, item):
            return text

        def requests(self, item, prompt_ids):
            return [prompt_ids]

    builder = PromptBuilder(_Text(), tokenizer, chat_template=True, system=None, max_model_len=1 << 30)
    (prepared,), errors = builder.prepare([Item(0, "0", {})])
    assert not errors, errors
    return prepared.requests[0]


@torch.no_grad()
def hf_continuation_logprobs(model, prompt_ids, continuations) -> list[list[float]]:
    """Per continuation, the log-probability of each of its tokens: the prompt through transformers
    once, then each continuation on a copy of transformers' own KV cache of the prompt."""
    out = model(torch.tensor([list(prompt_ids)]), use_cache=True)
    first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
    result = []
    for cont in continuations:
        lps = [first[cont[0]].item()]
        if len(cont) > 1:
            # transformers 5 calls it `cache`, 4.x `past_key_values`
            key = "cache" if "cache" in out else "past_key_values"
            cache = {key: copy.deepcopy(out[key])}
            logits = model(torch.tensor([list(cont[:-1])]), **cache).logits[0].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            lps += [logprobs[i, tok].item() for i, tok in enumerate(cont[1:])]
        result.append(lps)
    return result


class ReferenceEngine:
    """Answers scoring requests with transformers directly (the task logic's stand-in engine), and
    generation requests with canned texts."""

    def __init__(self, model, texts: dict[str, str] | None = None):
        self.model = model
        self.texts = texts or {}

    def run(self, request):
        from bulkrun.engine.core.outputs import RequestOutput

        if request.continuations is None:
            text = self.texts.get(request.request_id, "")
            return RequestOutput(
                request.request_id, request.prompt_token_ids, text=text, finish_reason="stop"
            )
        lps = hf_continuation_logprobs(self.model, request.prompt_token_ids, request.continuations)
        return RequestOutput(
            request.request_id,
            request.prompt_token_ids,
            finish_reason="scored",
            continuation_logprobs=lps,
        )


def run_items(task, tokenizer, engine, rows: list[dict]):
    """Rows through the job layer's real PromptBuilder (render -> chat template -> tokenize ->
    requests), each request through `engine`, then the task's result: one result per row, in order."""
    from bulkrun.job.feed import PromptBuilder

    items = [Item(index, str(fields.get("id", index)), fields) for index, fields in enumerate(rows)]
    builder = PromptBuilder(task, tokenizer, chat_template=True, system=None, max_model_len=1 << 30)
    prompts = task.content_free_prompts() if hasattr(task, "content_free_prompts") else []
    if prompts:  # calibration first, as the job layer does (job/calibrate.py)
        content_free = [(Item(-1 - k, "cf", {}), p) for k, p in enumerate(prompts)]
        prepared, errors = builder.prepare_rendered(content_free, [], sort=False)
        assert not errors, errors
        task.set_content_free([engine.run(r) for p in prepared for r in p.requests])
    prepared, errors = builder.prepare(items, sort=False)
    assert not errors, errors
    return [task.result(p.item, [engine.run(r) for r in p.requests]) for p in prepared]
