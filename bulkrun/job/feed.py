"""The reader thread: rows -> items with ids -> prepared windows, one window ahead of the engine.

It reads the whole input every run (reading is cheap next to inference) so that duplicate ids are
judged the same way every time: the first row with an id wins, whether or not it is already done.
Rows already committed are skipped, and so are rows outside this process's partition. A bounded
queue keeps at most two windows waiting: memory does not depend on the input's size.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bulkrun.io.windows import Prepared, PromptBuilder, error_record
from bulkrun.job.resume import RowSet
from bulkrun.tasks.base import Item, RowError

_END = object()


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
        value = fields.get(self.id_field)
        if value is None:
            raise RowError("missing_id", f"id field '{self.id_field}' is missing")
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
