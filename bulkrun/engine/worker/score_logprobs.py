"""Log-probabilities of the rows a step scores (bulkrun.engine.core.scoring decides which rows)."""

from __future__ import annotations

import torch

from bulkrun.engine.core.runner_output import RunnerOutput
from bulkrun.engine.core.scoring import ScoreRows


def compute_logprobs(rows: ScoreRows, logits, first_logit_row: int, result: RunnerOutput) -> None:
    """Fill result's score_logprobs / first_token_logprobs. `logits` holds the scoring rows from
    first_logit_row on, in ScoreRows order (fp32 or bf16 [N, vocab] tensor)."""
    spans = rows.spans
    at = first_logit_row
    if spans:
        targets = torch.tensor([t for s in spans for t in s.targets], device=logits.device)
        scored = logits[at : at + len(targets)].float().log_softmax(dim=-1)
        values = scored.gather(1, targets[:, None]).squeeze(1).tolist()
        start = 0
        for s in spans:
            result.score_logprobs[s.request.request_id] = values[start : start + len(s.targets)]
            start += len(s.targets)
        at += len(targets)
    requests = rows.first_token_requests
    if requests:
        # one log_softmax row per parent (its last prompt row), K gathers from it
        firsts = logits[at : at + len(requests)].float().log_softmax(dim=-1)
        row_index = [i for i, r in enumerate(requests) for _ in r.scoring.first_token_ids]
        tokens = [t for r in requests for t in r.scoring.first_token_ids]
        device = logits.device
        values = firsts[torch.tensor(row_index, device=device), torch.tensor(tokens, device=device)].tolist()
        start = 0
        for r in requests:
            end = start + len(r.scoring.first_token_ids)
            result.first_token_logprobs[r.request_id] = values[start:end]
            start = end
