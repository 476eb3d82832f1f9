"""Progress of a Ray job: workers push counts to one small board the driver reads for its one bar.

Counts are kept per slice attempt. A slice's first report is the number of its rows already committed
(resume), so the board total is "rows done", and when an attempt dies the driver drops that attempt's
counts: its replacement reports the committed ones again and redoes the rest. Plain classes here; the
Ray runner wraps them with ray.remote.
"""

from __future__ import annotations

import time
from typing import Any


class ProgressBoard:
    """Lives in a tiny actor: attempt key -> [items, tokens]."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}

    def add(self, attempt: str, items: int, tokens: int) -> None:
        counts = self._counts.setdefault(attempt, [0, 0])
        counts[0] += items
        counts[1] += tokens

    def drop(self, attempt: str) -> None:
        self._counts.pop(attempt, None)

    def totals(self) -> tuple[int, int]:
        return sum(c[0] for c in self._counts.values()), sum(c[1] for c in self._counts.values())


class ProgressReporter:
    """The worker side: a callable for run_job's on_progress that batches the remote calls."""

    def __init__(self, board: Any, attempt: str, every_s: float = 0.25) -> None:
        self._board = board
        self._attempt = attempt
        self._every_s = every_s
        self._items = 0
        self._tokens = 0
        self._last = 0.0

    def __call__(self, items: int, tokens: int = 0) -> None:
        self._items += items
        self._tokens += tokens
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self.flush()
            self._last = now

    def flush(self) -> None:
        if self._items or self._tokens:
            # Fire and forget: calls from one caller reach the actor in order.
            self._board.add.remote(self._attempt, self._items, self._tokens)
            self._items = self._tokens = 0
