"""The progress bar on stderr: items done of the total, errors, tokens/s, ETA. --quiet silences it."""

from __future__ import annotations

import sys
import time

from bulkrun.job.stats import RunStats


class Progress:
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
        wall = max(self.stats.wall_s, 1e-9)
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
