"""Rows -> items with ids -> windows of prepared engine requests, one window ahead of the engine.

A reader thread reads rows, gives them ids, and hands each window to the PromptBuilder, which renders
the items with the task, applies the chat template, tokenizes in one batch and sorts by length.

It reads the whole input every run (reading is cheap next to inference) so that duplicate ids are
judged the same way every time: the first row with an id wins, whether or not it is already done.
Rows already committed are skipped, and so are rows outside this process's partition. A bounded
queue keeps at most two windows waiting: memory does not depend on the input's size.

Sorting by prompt length puts similar lengths next to each other, so requests admitted together
finish prefill together and fewer blocks sit half-used. Lengths are grouped in buckets of 16 tokens;
inside a bucket the input order is kept (a stable sort), longest buckets first so that the long
requests start early instead of trailing at the end of the job.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bulkrun.engine.core.params import EngineRequest
from bulkrun.exceptions import RowError
from bulkrun.job.resume import RowSet
from bulkrun.tasks.base import Item, RawText, Task

_END = object()
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
        rendered = []
        for item in items:
            try:
                rendered.append((item, self.task.render(item)))
            except RowError as exc:
                errors.append(error_record(item.index, item.id, exc))
        return self.prepare_rendered(rendered, errors, sort)

    def prepare_rendered(self, rendered: list[tuple[Item, str | list[dict]]], errors: list[dict],
                         sort: bool = True) -> tuple[list[Prepared], list[dict]]:  # fmt: skip
        """Like prepare, for prompts already rendered (e.g. a task's content-free prompts)."""
        texts: list[tuple[Item, str, bool]] = []  # (item, text, add special tokens)
        chats: list[tuple[Item, list[dict]]] = []
        for item, prompt in rendered:
            if isinstance(prompt, RawText) or not self.chat_template:
                texts.append((item, _plain_text(prompt), True))
            else:
                chats.append((item, self.messages(prompt)))
        texts += self._apply_chat_template(chats, errors)
        prepared = self._tokenize(texts, errors)
        if sort:
            prepared.sort(key=lambda p: -(p.prompt_len // BUCKET_TOKENS))
        return prepared, errors

    def messages(self, rendered: str | list[dict]) -> list[dict]:
        """A rendered prompt as chat messages, with the system message (what a provider batch sends)."""
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
        if len(ids) >= self.max_model_len and not self.task.truncates_prompts:
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


@dataclass(slots=True)
class Window:
    prepared: list[Prepared] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)


class IdRegistry:
    """Item ids from a field (checked, unique) or the row number. Keeps 8-byte digests, not ids."""

    def __init__(self, id_field: str | None):
        self.id_field = id_field
        self._seen: set[int] = set()

    def item_id(self, index: int, fields: dict) -> str:
        if self.id_field is None:
            return str(index)
        if self.id_field not in fields:
            raise RowError("missing_id", f"id field '{self.id_field}' is missing")
        value = fields[self.id_field]
        if value is None:
            raise RowError("null_id", f"id field '{self.id_field}' is null")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise RowError("bad_id", f"id field '{self.id_field}' must be a string or an integer")
        item_id = str(value)
        try:
            key = int.from_bytes(hashlib.blake2b(item_id.encode(), digest_size=8).digest(), "little")
        except UnicodeEncodeError:
            raise RowError("invalid_utf8", f"id field '{self.id_field}' is not valid UTF-8") from None
        if key in self._seen:
            raise RowError("duplicate_id", f"id '{item_id}' was already used by an earlier row", item_id)
        self._seen.add(key)
        return item_id


class Feed:
    """Produces Windows in a background thread; iterate `windows()` in the main thread."""

    def __init__(
        self,
        rows: Iterator,
        builder: PromptBuilder,
        ids: IdRegistry,
        *,
        done: RowSet,
        window: int,
        sort: bool = True,
        select: Callable[[int], bool] | None = None,
    ):
        self._rows, self._builder, self._ids = rows, builder, ids
        self._done, self._window, self._sort, self._select = done, window, sort, select
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bulkrun-reader", daemon=True)
        self.rows_seen = 0

    def windows(self) -> Iterator[Window]:
        self._thread.start()
        while True:
            got = self._queue.get()
            if got is _END:
                return
            if isinstance(got, BaseException):
                raise got
            yield got

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass

    def _put(self, value) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for window in self._windows():
                if not self._put(window):
                    return
            self._put(_END)
        except BaseException as exc:  # handed to the main thread, which raises it
            self._put(exc)

    def _windows(self) -> Iterator[Window]:
        items: list[Item] = []
        errors: list[dict] = []
        for index, fields in self._rows:
            if self._stop.is_set():
                return
            self.rows_seen += 1
            error = fields if isinstance(fields, RowError) else None
            item_id = str(index) if self._ids.id_field is None else getattr(error, "item_id", None)
            if error is None:
                try:
                    item_id = self._ids.item_id(index, fields)
                except RowError as exc:
                    error, item_id = exc, exc.item_id
            if index in self._done or (self._select is not None and not self._select(index)):
                continue
            if error is not None:
                errors.append(error_record(index, item_id, error))
            else:
                items.append(Item(index, item_id, fields))
            if len(items) + len(errors) >= self._window:
                yield self._prepare(items, errors)
                items, errors = [], []
        if items or errors:
            yield self._prepare(items, errors)

    def _prepare(self, items: list[Item], errors: list[dict]) -> Window:
        prepared, more_errors = self._builder.prepare(items, sort=self._sort)
        return Window(prepared, errors + more_errors)
