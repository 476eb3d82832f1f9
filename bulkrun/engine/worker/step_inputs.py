"""Turn one SchedulerOutput into the flat tensors of a packed step, from persistent host state.

StepState keeps every running request's block table in one preallocated array (a row per request,
kept across steps: a step copies only the blocks appended since the last one) and builds the
step's positions, slot mapping and lengths with a few numpy operations over all rows, so the
per-request Python work of a decode step is a handful of list operations. Logits are requested
only for rows that sample or score, so the LM head runs on those rows alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress

import numpy as np
import torch

from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scheduler import ScheduledRequest, SchedulerOutput
from bulkrun.engine.core.scoring import ScoreRows, ScoreSpan
from bulkrun.model.attention_metadata import AttentionMetadata

__all__ = ["ScoreSpan", "StepInputs", "StepState", "build_step_inputs"]


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
    # (packed index, row among the previous step's sampled tokens): inputs the runner fills in
    pending_inputs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def score_spans(self) -> list[ScoreSpan]:
        return self.scores.spans

    @property
    def first_token_requests(self) -> list[Request]:
        return self.scores.first_token_requests


class StepState:
    """Host-side state of the steps of one runner: block-table rows that persist across steps."""

    def __init__(self, block_size: int, max_rows: int = 64, max_blocks_per_row: int = 16):
        self.block_size = block_size
        self.tables = np.zeros((max_rows, max_blocks_per_row), dtype=np.int32)
        self.filled = [0] * max_rows  # blocks of each row copied so far
        # keyed by the request object (a new request reusing a finished one's id gets its own row)
        self.row_of: dict[Request, int] = {}
        self.request_of: dict[str, Request] = {}
        self.free_rows = list(range(max_rows - 1, -1, -1))

    def release(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            req = self.request_of.pop(rid, None)
            row = self.row_of.pop(req, None)
            if row is not None:
                self.filled[row] = 0
                self.free_rows.append(row)

    def _assign(self, req: Request) -> int:
        if not self.free_rows:
            self._grow_rows()
        row = self.free_rows.pop()
        self.row_of[req] = row
        self.request_of[req.request_id] = req
        self.filled[row] = 0
        return row

    def _grow_rows(self) -> None:
        old = self.tables.shape[0]
        self.tables = np.concatenate([self.tables, np.zeros_like(self.tables)])
        self.filled += [0] * old
        self.free_rows.extend(range(2 * old - 1, old - 1, -1))

    def _copy_table(self, row: int, table: list[int]) -> None:
        have = self.filled[row]
        if len(table) < have:  # not a growth (a new owner of the row): rewrite it
            have = 0
        if len(table) > self.tables.shape[1]:
            wider = np.zeros((self.tables.shape[0], max(len(table), 2 * self.tables.shape[1])), np.int32)
            wider[:, : self.tables.shape[1]] = self.tables
            self.tables = wider
        self.tables[row, have : len(table)] = table[have:]
        self.filled[row] = len(table)

    def build(self, sched: SchedulerOutput, pending: dict[str, int]) -> StepInputs:
        """Host (CPU) tensors of the step. `pending`: request id -> the row, among the previous
        step's sampled tokens, of the token at a position the scheduler has not appended yet
        (async scheduling): its input id is left 0 and listed in StepInputs.pending_inputs."""
        if sched.batch is not None and sched.num_scheduled_tokens == len(sched.requests):
            return self._build_decode(sched, pending)
        batch = sched.batch
        if batch is None:  # a step built by hand: block-table rows kept here
            self.release(sched.released_request_ids)
            rows = [self._row(r) for r in sched.requests]
        else:
            rows = sched.slots
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
        if batch is None:
            inputs = self._tensors(sched, rows, ids, scoring)
        else:
            width = max(1, int(batch.num_blocks[rows].max())) if rows else 1
            inputs = self._tensors(sched, rows, ids, scoring, batch.tables, width)
        inputs.pending_inputs = late
        return inputs

    def _row(self, r: Request) -> int:
        row = self.row_of.get(r)
        if row is None:
            row = self._assign(r)
        if len(r.block_table) != self.filled[row]:
            self._copy_table(row, r.block_table)
        return row

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
        inputs.pending_inputs = late
        return inputs

    def _tensors(
        self, sched: SchedulerOutput, rows, ids, scoring: list[int], tables=None, width=0
    ) -> StepInputs:
        """rows: each sequence's row of `tables` (default: this state's)."""
        bs = self.block_size
        if tables is None:
            tables = self.tables
            width = max(1, max(map(self.filled.__getitem__, rows), default=1))
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
        metadata = AttentionMetadata(
            positions=torch.from_numpy(positions),
            slot_mapping=torch.from_numpy(slots),
            block_tables=torch.from_numpy(tables[rows_np, :width]),
            query_start_loc=torch.from_numpy(query_start_loc),
            seq_lens=torch.from_numpy((start_np + size_np).astype(np.int32)),
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


def build_step_inputs(scheduled: list[ScheduledRequest], block_size: int) -> StepInputs:
    """One step's inputs from fresh state (tests, profiling): CPU tensors."""
    return StepState(block_size).build(SchedulerOutput(scheduled), pending={})
