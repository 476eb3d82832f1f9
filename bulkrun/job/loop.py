"""The job loop: the windows' requests go through the engine's one loop (Engine.stream, which feeds
them as capacity allows); finished items become records; checkpoints commit them; a bar shows it.

An item is finished when all its requests (e.g. --n samples) came back; then the task turns the
outputs into a result record, or a RowError into an error record. Records are buffered in the shard
writers and committed at every checkpoint, and once more at the end (or on Ctrl-C).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bulkrun.engine.core.outputs import RequestOutput, StepStats
from bulkrun.engine.core.params import EngineRequest
from bulkrun.exceptions import RowError
from bulkrun.io.shards import ShardWriter
from bulkrun.job.feed import Prepared, Window, error_record
from bulkrun.job.stats import RunStats
from bulkrun.tasks.base import Item, Task

HEARTBEAT_S = 60.0  # refresh the lock at least this often, commits or not


@dataclass(slots=True)
class _Pending:
    item: Item
    outputs: list
    left: int
    error: RowError | None = None


@dataclass
class Checkpointer:
    """Commit every `items` records and/or every `seconds`, whichever comes first. When the time
    is up with nothing to commit, only `heartbeat` is called (the lock shows the run is alive)."""

    items: int | None
    seconds: float | None
    commit: Callable[[], None]
    heartbeat: Callable[[], None] = lambda: None
    _last: float = field(default_factory=time.monotonic)

    def maybe(self, buffered: int) -> None:
        due_items = self.items is not None and buffered >= self.items
        due_time = time.monotonic() - self._last >= (self.seconds or HEARTBEAT_S)
        if due_items or (due_time and buffered and self.seconds is not None):
            self.now()
        elif due_time:
            self.heartbeat()
            self._last = time.monotonic()

    def now(self) -> None:
        self.commit()
        self._last = time.monotonic()


class JobLoop:
    def __init__(self, engine, task: Task, results: ShardWriter, errors: ShardWriter, stats: RunStats,
                 keep_fields: list[str] | None = None):  # fmt: skip
        self.engine, self.task = engine, task
        self.results, self.errors, self.stats = results, errors, stats
        self.keep_fields = keep_fields or []
        self.pending: dict[int, _Pending] = {}
        self.on_record: Callable[[], None] = lambda: None  # progress bar hooks
        self.on_step: Callable[[], None] = lambda: None

    def run(self, windows: Iterator[Window], checkpointer: Checkpointer) -> None:
        """Stream the windows' requests through the engine's one loop until every item is done."""

        def after_step(step: StepStats) -> None:
            self.stats.on_step(step)
            self.on_step()
            checkpointer.maybe(len(self.results) + len(self.errors))

        for output in self.engine.stream(self._requests(windows), on_step=after_step):
            self._on_output(output)

    def _requests(self, windows: Iterator[Window]) -> Iterator[EngineRequest]:
        for window in windows:
            for record in window.errors:
                self._write_error(record)
            for prepared in window.prepared:
                yield from self._item_requests(prepared)

    def _item_requests(self, prepared: Prepared) -> Iterator[EngineRequest]:
        index = prepared.item.index
        self.pending[index] = _Pending(prepared.item, [None] * len(prepared.requests), len(prepared.requests))
        for k, request in enumerate(prepared.requests):
            request.request_id = f"{index}/{k}"
            yield request

    def _on_output(self, output: RequestOutput) -> None:
        self.stats.on_output(output)
        index, k = _split_id(output.request_id)
        pending = self.pending[index]
        if output.finish_reason == "error" and pending.error is None:  # refused at intake, or failed
            pending.error = RowError("engine_error", output.error or "the engine failed this request")
        self._arrived(index, k, output)

    def _arrived(self, index: int, k: int, output: RequestOutput) -> None:
        pending = self.pending[index]
        pending.outputs[k] = output
        pending.left -= 1
        if pending.left:
            return
        del self.pending[index]
        item = pending.item
        if pending.error is None:
            try:
                columns = self.task.result(item, pending.outputs)
            except RowError as exc:
                pending.error = exc
        if pending.error is not None:
            self._write_error(error_record(item.index, item.id, pending.error))
            return
        record = keep_input_fields(
            {"row": item.index, "id": item.id, **columns}, item.fields, self.keep_fields
        )
        self.results.add(record)
        self.stats.items += 1
        self.on_record()

    def _write_error(self, record: dict) -> None:
        self.errors.add(record)
        self.stats.errors += 1
        self.on_record()


def keep_input_fields(record: dict, fields: dict, names: list[str]) -> dict:
    """Copy the --keep-field input columns into a result record; prefixed `input_` where a name is taken."""
    for name in names:
        record[name if name not in record else f"input_{name}"] = fields.get(name)
    return record


def _split_id(request_id: str) -> tuple[int, int]:
    index, _, k = request_id.partition("/")
    return int(index), int(k)


class ProgressBar:
    """Items done of the total, errors, tokens/s, ETA on stderr; --quiet silences it."""

    def __init__(self, total: int | None, done: int, stats: RunStats, *, quiet: bool, label: str = ""):
        self.stats = stats
        self._last_postfix = 0.0
        self.bar = None
        if not quiet:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=done,
                unit="item",
                desc=label or None,
                file=sys.stderr,
                dynamic_ncols=True,
                smoothing=0.1,
            )

    def record(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def step(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.bar is None or (now - self._last_postfix < 0.5 and not force):
            return
        self._last_postfix = now
        wall = max(self.stats.elapsed_s, 1e-9)
        self.bar.set_postfix(
            {
                "gen tok/s": f"{self.stats.generated_tokens / wall:.0f}",
                "tok/s": f"{(self.stats.prompt_tokens + self.stats.generated_tokens) / wall:.0f}",
                "errors": self.stats.errors,
            },
            refresh=False,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.step(force=True)  # the final figures, not those of half a second ago
            self.bar.close()
