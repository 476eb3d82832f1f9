"""Log-probabilities of the rows a step scores (bulkrun.engine.core.scoring decides which rows).

They are computed and kept on the device; the step handle reads them back with its tokens, so a
scoring step launches without the host waiting. The log_softmax runs over at most
SCORE_CHUNK_ROWS rows at a time: a step that scores its whole token budget would otherwise hold
two fp32 copies of [budget, vocab] at once (16,384 x 128,256 rows: 17 GB).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bulkrun.engine.core.runner_output import RunnerOutput
from bulkrun.engine.core.scoring import ScoreRows

SCORE_CHUNK_ROWS = 2048

# a device tensor, and how its host copy fills the step's RunnerOutput
ReadBack = tuple[torch.Tensor, Callable[[np.ndarray, RunnerOutput], None]]


def score_logprobs(rows: ScoreRows, logits: torch.Tensor, first_logit_row: int, stage) -> list[ReadBack]:
    """The scored log-probabilities (score_logprobs, first_token_logprobs) as device tensors to read
    back. `logits` holds the scoring rows from first_logit_row on, in ScoreRows order (fp32 or bf16
    [N, vocab]); `stage` puts host data on the device (Staging.to_device)."""
    out: list[ReadBack] = []
    spans = rows.spans
    at = first_logit_row
    if spans:
        targets = [t for s in spans for t in s.targets]
        values = gathered_logprobs(logits[at : at + len(targets)], stage(targets, torch.int64))
        out.append((values, _fill_spans(spans)))
        at += len(targets)
    requests = rows.first_token_requests
    if requests:
        # one log_softmax row per parent (its last prompt row), K gathers from it
        firsts = logits[at : at + len(requests)].float().log_softmax(dim=-1)
        row_index = [i for i, r in enumerate(requests) for _ in r.scoring.first_token_ids]
        tokens = [t for r in requests for t in r.scoring.first_token_ids]
        values = firsts[stage(row_index, torch.int64), stage(tokens, torch.int64)]
        out.append((values, _fill_first_tokens(requests)))
    return out


def gathered_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits[i])[targets[i]] for every row, SCORE_CHUNK_ROWS rows at a time."""
    parts = [
        logits[i : i + SCORE_CHUNK_ROWS]
        .float()
        .log_softmax(dim=-1)
        .gather(1, targets[i : i + SCORE_CHUNK_ROWS, None])
        for i in range(0, logits.shape[0], SCORE_CHUNK_ROWS)
    ]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).squeeze(1)


def _fill_spans(spans):
    def fill(values: np.ndarray, result: RunnerOutput) -> None:
        values = values.tolist()
        start = 0
        for s in spans:
            result.score_logprobs[s.request.request_id] = values[start : start + len(s.targets)]
            start += len(s.targets)

    return fill


def _fill_first_tokens(requests):
    def fill(values: np.ndarray, result: RunnerOutput) -> None:
        values = values.tolist()
        start = 0
        for r in requests:
            end = start + len(r.scoring.first_token_ids)
            result.first_token_logprobs[r.request_id] = values[start:end]
            start = end

    return fill
