"""Reasoning output: a model that thinks before it answers (Qwen3's `<think> ... </think>`) gets its
thoughts in a `reasoning` column and only the answer in `text`.

A model is a thinking model when its vocabulary has the `</think>` token. Its output splits at the
first `</think>`: before it (less a leading `<think>`) is the reasoning, after it the answer. An output
that opened `<think>` (or whose prompt opened it: Qwen3-2507's templates do) and never closed it is
all reasoning, with no answer; cut by max_tokens its finish_reason is "length_in_reasoning", so a
truncated thought is never passed off as an answer.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
LENGTH_IN_REASONING = "length_in_reasoning"


def thinks(tokenizer) -> bool:
    """Whether the model writes <think> blocks (its vocabulary has the closing tag as one token)."""
    try:
        return len(tokenizer.encode(CLOSE, add_special_tokens=False)) == 1
    except (AttributeError, TypeError, ValueError):
        return False


def split_reasoning(text: str, finish_reason: str | None, prompt_opened: bool = False):
    """(reasoning, answer, finish_reason) of one output of a thinking model."""
    head, closed, tail = text.partition(CLOSE)
    if closed:
        return head.removeprefix(OPEN).lstrip("\n").rstrip(), tail.lstrip(), finish_reason
    stripped = text.lstrip()
    if prompt_opened or stripped.startswith(OPEN):  # the thought never ended
        reason = LENGTH_IN_REASONING if finish_reason == "length" else finish_reason
        return stripped.removeprefix(OPEN).strip(), "", reason
    return "", text, finish_reason  # answered without thinking (e.g. enable_thinking=false)


def prompt_opens_thinking(tokenizer, prompt_token_ids: list[int]) -> bool:
    """Whether the prompt's last think tag is an unclosed <think> (the template opened the thought)."""
    tail = tokenizer.decode(prompt_token_ids[-8:], skip_special_tokens=False)
    return tail.rfind(OPEN) > tail.rfind(CLOSE)
