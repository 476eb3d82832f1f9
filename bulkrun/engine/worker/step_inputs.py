"""Turn one SchedulerOutput into the flat tensors of a packed step, from persistent host state.

StepBuilder reads every running request's block table and newest tokens from the scheduler's
RunningBatch (one preallocated row per request, kept across steps) and builds the step's positions,
slot mapping and lengths with a few numpy operations over all rows, so the per-request Python work
of a decode step is a handful of list operations. A step built by hand (tests, the runner's
profiling step) runs through a RunningBatch of its own (`running_batch`). Logits are requested
only for rows that sample or score, so the LM head runs on those rows alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress

import numpy as np
import torch

from bulkrun.engine.core.request import Request
from bulkrun.engine.core.running_batch import RunningBatch
from bulkrun.engine.core.scheduler import SchedulerOutput
from bulkrun.engine.core.scoring import ScoreRows, ScoreSpan
from bulkrun.model.attention_metadata import AttentionMetadata, SampledRows

__all__ = ["ScoreSpan", "StepBuilder", "StepInputs", "build_step_inputs", "running_batch"]
_NONE = np.zeros(0, np.int64)


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [N] int64: packed rows whose logits are needed
    sample_requests: list[Request]  # logits rows 0 .. len-1, in this order
    scores: ScoreRows = field(default_factory=ScoreRows)  # rows after the sampled ones
    num_rows: int = 0  # sequences in the step
    decode_only: bool = False  # every sequence computes exactly one token
    sample_ends: np.ndarray | None = None  # per sample row: the position of the token it samples
    # inputs the runner fills in from the previous step's sampled tokens (async scheduling): the
    # packed index of each, and its row among those tokens (int64 arrays, packed order)
    pending_at: np.ndarray = field(default_factory=lambda: _NONE)
    pending_rows: np.ndarray = field(default_factory=lambda: _NONE)

    def set_pending(self, late: list[tuple[int, int]]) -> None:
        if late:
            at, rows = zip(*late, strict=True)
            self.pending_at, self.pending_rows = np.array(at, np.int64), np.array(rows, np.int64)

    @property
    def pending_rows_line_up(self) -> bool:
        """The pending inputs are packed rows 0..k-1 and take the previous tokens 0..k-1: a plain
        slice copy places them (the steady decode step of an unchanged batch)."""
        at, rows, k = self.pending_at, self.pending_rows, len(self.pending_at)
        return k > 0 and at[0] == 0 and at[-1] == k - 1 and np.array_equal(at, rows)

    @property
    def score_spans(self) -> list[ScoreSpan]:
        return self.scores.spans

    @property
    def first_token_requests(self) -> list[Request]:
        return self.scores.first_token_requests


class StepBuilder:
    """Builds each step's inputs from the scheduler's RunningBatch: its block tables and newest
    tokens are there already, so a steady decode step runs no Python per row.

    long_rope_after (LongRoPE's short context N, None for other models): a request on the long
    factors rotates by row N + position of the model's rotary table (DecoderLM.init_rotary)."""

    def __init__(self, block_size: int, long_rope_after: int | None = None):
        self.block_size = block_size
        self.long_rope_after = long_rope_after

    def build(self, sched: SchedulerOutput, pending: Mapping[str, int]) -> StepInputs:
        """Host (CPU) tensors of the step. `pending`: request id -> the row, among the previous
        step's sampled tokens, of the token at a position the scheduler has not appended yet
        (async scheduling): its input id is left 0 and listed in pending_at / pending_rows."""
        if sched.batch is None:  # a step built by hand (tests, the profiling step)
            with running_batch(sched, self.block_size):
                return self.build(sched, pending)
        if sched.num_scheduled_tokens == len(sched.requests):
            return self._build_decode(sched, pending)
        batch, rows = sched.batch, sched.slots
        ids: list[int] = []
        scoring: list[int] = []  # indexes of scoring rows
        late: list[tuple[int, int]] = []  # (packed index, previous sample row)
        for i, (r, start, n) in enumerate(zip(sched.requests, sched.starts, sched.num_tokens, strict=True)):
            tokens = r.token_ids
            if start + n <= len(tokens):
                if n == 1:
                    ids.append(tokens[start])
                else:
                    ids.extend(tokens[start : start + n])
            else:  # the last input is the token the previous step sampled, still in flight
                ids.extend(tokens[start : start + n - 1])
                late.append((len(ids), pending[r.request_id]))
                ids.append(0)
            if r.scoring is not None:
                scoring.append(i)
        width = max(1, int(batch.num_blocks[rows].max())) if rows else 1
        inputs = self._tensors(sched, rows, ids, scoring, batch.tables, width)
        inputs.set_pending(late)
        return inputs

    def _build_decode(self, sched: SchedulerOutput, pending: dict[str, int]) -> StepInputs:
        """A step in which every row computes one token, from the scheduler's RunningBatch: its
        block tables and last tokens are there already, so no Python runs per row."""
        batch = sched.batch
        rows = sched.array("slots")
        starts = sched.array("starts")
        landed = batch.num_tokens[rows]
        ids = batch.last_token[rows]  # the input at start == landed - 1, the usual case
        late: list[tuple[int, int]] = []
        other = np.flatnonzero(starts != landed - 1)
        if len(other):
            requests = sched.requests
            in_flight = starts[other] >= landed[other]
            # async scheduling: the token the previous step sampled has not landed; the runner
            # fills it in from that step's tokens
            rows_late = other[in_flight].tolist()
            ids[rows_late] = 0
            late = list(
                zip(
                    rows_late,
                    map(pending.__getitem__, (requests[i].request_id for i in rows_late)),
                    strict=True,
                )
            )
            for i in other[~in_flight].tolist():
                ids[i] = requests[i].token_ids[starts[i]]
        scoring = np.flatnonzero(batch.compute_limit[rows] >= 0).tolist()
        width = max(1, int(batch.num_blocks[rows].max()))
        inputs = self._tensors(sched, rows, ids, scoring, batch.tables, width)
        inputs.set_pending(late)
        return inputs

    def _tensors(
        self, sched: SchedulerOutput, rows, ids, scoring: list[int], tables, width: int
    ) -> StepInputs:
        """rows: each sequence's row (slot) of `tables`."""
        bs = self.block_size
        num_rows = len(rows)
        rows_np = np.asarray(rows, dtype=np.int64)
        start_np = sched.array("starts").copy()  # becomes the positions tensor
        size_np = sched.array("num_tokens")
        ends = np.cumsum(size_np)
        total = int(ends[-1]) if num_rows else 0
        decode_only = total == num_rows
        if decode_only:
            positions, seq_rows = start_np, rows_np
        else:
            seq_index = np.repeat(np.arange(num_rows), size_np)
            positions = np.arange(total) - (ends - size_np - start_np)[seq_index]
            seq_rows = rows_np[seq_index]
        slots = tables[seq_rows, positions // bs].astype(np.int64) * bs + positions % bs
        rope_rows = None
        if self.long_rope_after is not None:
            rope_rows = torch.from_numpy(positions + self.long_rope_after * sched.batch.long_rope[seq_rows])
        query_start_loc = np.zeros(num_rows + 1, dtype=np.int32)
        query_start_loc[1:] = ends
        sample_mask = sched.array("samples")
        sample_rows = (ends - 1)[sample_mask] if num_rows else ends
        scores = ScoreRows()
        if scoring:
            requests, starts, sizes = sched.requests, sched.starts, sched.num_tokens
            for i in scoring:
                scores.add(requests[i], starts[i], sizes[i], int(ends[i] - sizes[i]))
            scores.shift(len(sample_rows))
        logits_indices = np.concatenate([sample_rows, np.array(scores.rows, dtype=np.int64)])
        sampled = None
        if not scores.rows and 0 < len(sample_rows) < total:  # a prompt step: most rows only fill the cache
            sampled_starts = np.zeros(num_rows + 1, dtype=np.int32)
            sampled_starts[1:] = np.cumsum(sample_mask)
            sampled = SampledRows(
                torch.from_numpy(sample_rows.astype(np.int64)), torch.from_numpy(sampled_starts)
            )
        metadata = AttentionMetadata(
            positions=torch.from_numpy(positions),
            slot_mapping=torch.from_numpy(slots),
            block_tables=torch.from_numpy(tables[rows_np, :width]),
            query_start_loc=torch.from_numpy(query_start_loc),
            seq_lens=torch.from_numpy((start_np + size_np).astype(np.int32)),
            rope_rows=rope_rows,
            sampled=sampled,
        )
        return StepInputs(
            input_ids=torch.from_numpy(np.asarray(ids, dtype=np.int64)),
            metadata=metadata,
            logits_indices=torch.from_numpy(logits_indices.astype(np.int64)),
            # every row samples in a steady decode step: the list itself (read-only here)
            sample_requests=sched.requests
            if sample_mask.all()
            else list(compress(sched.requests, sched.samples)),
            scores=scores,
            num_rows=num_rows,
            decode_only=decode_only,
            sample_ends=(start_np + size_np)[sample_mask] if num_rows else ends,
        )


def build_step_inputs(
    rows: list[tuple[Request, int, bool]], block_size: int, long_rope_after: int | None = None
) -> StepInputs:
    """One step's inputs built by hand (tests) from (request, num_tokens, sample) rows: CPU tensors."""
    return StepBuilder(block_size, long_rope_after).build(SchedulerOutput(rows), pending={})


@contextmanager
def running_batch(sched: SchedulerOutput, block_size: int):
    """A step built by hand runs through a RunningBatch as every scheduled step does: its requests
    take slots for the step and give them back after (their counters move back onto them)."""
    requests = list(dict.fromkeys(sched.requests))
    widest = max((len(r.block_table) for r in requests), default=1)
    batch = RunningBatch(block_size, caching=False, max_rows=max(1, len(requests)), max_blocks=max(1, widest))
    for r in requests:
        batch.add(r)
    sched.batch, sched.slots = batch, [r.slot for r in sched.requests]
    try:
        yield batch
    finally:
        for r in requests:
            batch.remove(r)
        sched.batch, sched.slots = None, None
