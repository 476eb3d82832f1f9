"""Turn a window of items into engine requests: render, chat template, tokenize in one batch, sort.

Sorting by prompt length puts similar lengths next to each other, so requests admitted together
finish prefill together and fewer blocks sit half-used. Lengths are grouped in buckets of 16 tokens;
inside a bucket the input order is kept (a stable sort), longest buckets first so that the long
requests start early instead of trailing at the end of the job.
"""

from __future__ import annotations

from dataclasses import dataclass

from bulkrun.engine.params import EngineRequest
from bulkrun.tasks.base import Item, RawText, RowError, Task

BUCKET_TOKENS = 16


@dataclass(slots=True)
class Prepared:
    item: Item
    prompt_len: int
    requests: list[EngineRequest]


def error_record(index: int, item_id: str | None, error: RowError) -> dict:
    return {"row": index, "id": item_id, "kind": error.kind, "message": error.message}


class PromptBuilder:
    """Renders items with the task and turns them into token ids, a window at a time."""

    def __init__(self, task: Task, tokenizer, *, chat_template: bool, system: str | None, max_model_len: int):
        self.task = task
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.system = system
        self.max_model_len = max_model_len

    def prepare(self, items: list[Item], sort: bool = True) -> tuple[list[Prepared], list[dict]]:
        """The window's requests (length-sorted when `sort`) and its error records."""
        errors: list[dict] = []
        texts: list[tuple[Item, str, bool]] = []  # (item, text, add special tokens)
        chats: list[tuple[Item, list[dict]]] = []
        for item in items:
            try:
                rendered = self.task.render(item)
            except RowError as exc:
                errors.append(error_record(item.index, item.id, exc))
                continue
            if isinstance(rendered, RawText) or not self.chat_template:
                texts.append((item, _plain_text(rendered), True))
            else:
                chats.append((item, self._messages(rendered)))
        texts += self._apply_chat_template(chats, errors)
        prepared = self._tokenize(texts, errors)
        if sort:
            prepared.sort(key=lambda p: -(p.prompt_len // BUCKET_TOKENS))
        return prepared, errors

    def _messages(self, rendered: str | list[dict]) -> list[dict]:
        messages = [{"role": "user", "content": rendered}] if isinstance(rendered, str) else list(rendered)
        if self.system is not None and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system})
        return messages

    def _apply_chat_template(self, chats, errors) -> list[tuple[Item, str, bool]]:
        if not chats:
            return []
        apply = self.tokenizer.apply_chat_template
        try:
            rendered = apply([m for _, m in chats], tokenize=False, add_generation_prompt=True)
            return [(item, text, False) for (item, _), text in zip(chats, rendered, strict=True)]
        except Exception:  # one bad conversation fails the batch: redo one by one to find it
            pass
        out = []
        for item, messages in chats:
            try:
                out.append((item, apply(messages, tokenize=False, add_generation_prompt=True), False))
            except Exception as exc:
                error = RowError("template_error", f"chat template failed: {exc}")
                errors.append(error_record(item.index, item.id, error))
        return out

    def _tokenize(self, texts, errors) -> list[Prepared]:
        prepared = []
        for special in (False, True):
            group = [(item, text) for item, text, s in texts if s == special]
            if not group:
                continue
            encoded = self.tokenizer([t for _, t in group], add_special_tokens=special)["input_ids"]
            for (item, _), ids in zip(group, encoded, strict=True):
                try:
                    prepared.append(self._requests(item, list(ids)))
                except RowError as exc:
                    errors.append(error_record(item.index, item.id, exc))
        prepared.sort(key=lambda p: p.item.index)  # input order inside a bucket
        return prepared

    def _requests(self, item: Item, ids: list[int]) -> Prepared:
        if not ids:
            raise RowError("empty_text", "the prompt has no tokens")
        if len(ids) >= self.max_model_len:
            raise RowError(
                "prompt_too_long",
                f"prompt of {len(ids)} tokens does not fit the model's context of {self.max_model_len}",
            )
        requests = self.task.requests(item, ids)
        if not requests:
            raise RowError("no_requests", "the task made no requests for this row")
        return Prepared(item, len(ids), requests)


def _plain_text(rendered: str | list[dict]) -> str:
    if isinstance(rendered, str):
        return str(rendered)
    return "\n\n".join(str(m.get("content", "")) for m in rendered)
