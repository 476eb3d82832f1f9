"""The runner's side of constrained decoding: one step's token masks, filled on a side thread while
the model's forward runs, applied to the constrained rows' logits before sampling.

`GrammarMasks.start(requests)` is called before the forward: it hands the constrained sample rows'
matchers to llguidance's batch filler (its own threads, GIL released) on a side thread and returns
at once; None when no row is constrained, so free batches pay nothing. That overlap is for a device
that computes while the host's cores are free. On the CPU the forward already keeps every core
busy, and a side thread competing with its threads costs the forward more than the fill itself
(docs/benchmarks.md, design figures), so there the fill runs first, on all
cores, and the forward after it. After the forward, `apply`
masks the logits rows (greedy and sampled rows alike: the sampler then sees only allowed tokens).
A constrained row always gets its logits (never the screened greedy head, whose token the host
would have to read back to check against the grammar).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from bulkrun.engine.structured_output.bitmask import apply_token_bitmask
from bulkrun.engine.structured_output.grammar import MaskFiller


class GrammarMasks:
    """Per runner: the mask filler, its side thread and a reused bitmask buffer."""

    def __init__(self, vocab_size: int, overlap: bool = True) -> None:
        """overlap: fill on a side thread during the forward (a GPU), else before it (the CPU)."""
        self._words = (vocab_size + 31) // 32  # the grammar tokenizer is built for the same vocabulary
        self._overlap = overlap
        self._filler: MaskFiller | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._buffer = np.zeros((0, 0), dtype=np.int32)

    def start(self, requests: list) -> StepMasks | None:
        rows = [i for i, r in enumerate(requests) if r.grammar is not None]
        if not rows:
            return None
        if self._filler is None:
            self._filler = MaskFiller()
            if self._overlap:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        matchers = [requests[i].grammar for i in rows]
        bitmask = self._rows(len(rows))
        if self._overlap:
            future = self._thread.submit(self._filler.fill, matchers, bitmask)
        else:
            future = Future()
            self._filler.fill_here(matchers, bitmask)
            future.set_result(None)
        return StepMasks(rows, matchers, bitmask, future)

    def _rows(self, count: int) -> np.ndarray:
        if self._buffer.shape[0] < count:
            self._buffer = np.zeros((max(count, 2 * self._buffer.shape[0]), self._words), dtype=np.int32)
        return self._buffer[:count]


class StepMasks:
    """One step's masks: row j of the bitmask belongs to sample row rows[j]."""

    def __init__(self, rows: list[int], matchers: list, bitmask: np.ndarray, future: Future):
        self.rows, self.matchers, self._bitmask, self._future = rows, matchers, bitmask, future
        self._slot = {row: j for j, row in enumerate(rows)}

    def covers(self, row: int) -> bool:
        """Whether sample row `row` is constrained."""
        return row in self._slot

    def _mask(self) -> np.ndarray:
        self._future.result()  # the fill ran while the forward did
        return self._bitmask

    def apply(self, logits: torch.Tensor, logits_rows: list[int] | range, stage) -> None:
        """Mask `logits` in place; logits row k holds sample row logits_rows[k]. `stage` puts host
        data on the device (Staging.to_device): the mask rows and their logits rows cross
        together, and nothing waits for the device."""
        picked = [(k, self._slot[row]) for k, row in enumerate(logits_rows) if row in self._slot]
        if not picked:
            return
        at, slots = zip(*picked, strict=True)
        mask = stage(self._mask()[list(slots)])
        apply_token_bitmask(logits, mask, stage(at, torch.int64))
