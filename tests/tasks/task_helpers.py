"""Helpers for the task tests: the job layer's default prompt rendering and a transformers reference
scorer for continuation log-probabilities."""

from __future__ import annotations

import copy

import torch


def load_hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """The job layer's default rendering: one user message through the chat template."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


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
        from bulkrun.engine.outputs import RequestOutput

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
    """The job layer's per-item flow (render -> chat template -> requests -> engine -> result)."""
    from bulkrun.tasks.base import Item

    results = []
    for index, fields in enumerate(rows):
        item = Item(index, str(fields.get("id", index)), fields)
        prompt_ids = chat_prompt_ids(tokenizer, task.render(item))
        outputs = [engine.run(r) for r in task.requests(item, prompt_ids)]
        results.append(task.result(item, outputs))
    return results
