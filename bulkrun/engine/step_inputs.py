"""Turn one SchedulerOutput into the flat tensors of a packed step (once per step, no padding).

Python lists are gathered in one pass over the scheduled requests; everything per-token (positions,
slot mapping) is then computed with a few vectorised tensor ops rather than per-token Python.
Logits are requested only for rows that sample or score, so the LM head runs on those rows alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from bulkrun.model.attention_metadata import AttentionMetadata
from bulkrun.engine.request import Request
from bulkrun.engine.scheduler import ScheduledRequest


@dataclass(slots=True)
class ScoreSpan:
    request: Request
    first_row: int  # into the logits rows
    targets: list[int]  # token_ids[p + 1] for each scored position p, in position order


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [N] int64: packed rows whose logits are needed
    sample_requests: list[Request]  # logits rows 0 .. len-1, in this order
    score_spans: list[ScoreSpan]  # rows after the sampled ones
    # scoring parents whose last prompt row is computed this step: one logits row each, after the
    # score spans' rows, to score every continuation's first token
    first_token_requests: list[Request] = field(default_factory=list)


def build_step_inputs(scheduled: list[ScheduledRequest], block_size: int) -> StepInputs:
    """CPU tensors for the step; the runner moves them to its device."""
    ids: list[int] = []
    starts, query_lens, tables = [], [], []
    sample_rows, sample_requests = [], []
    score_rows: list[int] = []
    spans: list[ScoreSpan] = []
    first_rows, first_requests = [], []
    row = 0
    for item in scheduled:
        r, n = item.request, item.num_tokens
        start = r.num_computed_tokens
        ids.extend(r.token_ids[start : start + n])
        starts.append(start)
        query_lens.append(n)
        tables.append(r.block_table)
        if item.sample:
            sample_rows.append(row + n - 1)
            sample_requests.append(r)
        if r.score_start is not None:
            # positions p of this chunk with score_start <= p + 1 < len(token_ids)
            lo, hi = max(start, r.score_start - 1), min(start + n, len(r.token_ids) - 1)
            if hi > lo:
                spans.append(ScoreSpan(r, len(score_rows), r.token_ids[lo + 1 : hi + 1]))
                score_rows.extend(range(row + lo - start, row + hi - start))
        if r.first_token_ids is not None and start + n == len(r.token_ids):
            first_rows.append(row + n - 1)
            first_requests.append(r)
        row += n
    for span in spans:
        span.first_row += len(sample_rows)
    metadata = _metadata(starts, query_lens, tables, block_size)
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.long),
        metadata=metadata,
        logits_indices=torch.tensor(sample_rows + score_rows + first_rows, dtype=torch.long),
        sample_requests=sample_requests,
        score_spans=spans,
        first_token_requests=first_requests,
    )


def _metadata(starts: list[int], query_lens: list[int], tables: list[list[int]], block_size: int):
    width = max((len(t) for t in tables), default=1) or 1
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    block_tables = block_tables.view(len(tables), width)
    lens = torch.tensor(query_lens, dtype=torch.long)
    start_pos = torch.tensor(starts, dtype=torch.long)
    query_start_loc = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    torch.cumsum(lens, 0, out=query_start_loc[1:])
    seq_index = torch.repeat_interleave(torch.arange(len(query_lens)), lens)
    # position of packed row t = its sequence's first new position + (t - the sequence's first row)
    offset = start_pos - query_start_loc[:-1].long()
    positions = torch.arange(int(lens.sum())) + offset.index_select(0, seq_index)
    blocks = block_tables.long()[seq_index, positions // block_size]
    return AttentionMetadata(
        positions=positions,
        slot_mapping=blocks * block_size + positions % block_size,
        block_tables=block_tables,
        query_start_loc=query_start_loc,
        seq_lens=(start_pos + lens).to(torch.int32),
    )
