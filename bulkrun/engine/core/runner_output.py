"""What the model runner returns for one step. Plain Python so the scheduler side never needs torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class RunnerOutput:
    # request_id -> the new token, for every SchedulerOutput row with sample=True (ModelRunner fills
    # it only for execute(): the engine reads sampled_tokens)
    sampled: dict[str, int] = field(default_factory=dict)
    # the same tokens in the order of the step's sample rows, where the runner has them so (a
    # list or an int64 numpy array)
    sampled_tokens: Sequence[int] | None = None
    # mixture-of-experts models: tokens routed to each expert this step, summed over the MoE layers
    expert_tokens: tuple[int, ...] | None = None
    # request_id -> log-probability of that token (only for requests with params.logprobs)
    sampled_logprobs: dict[str, float] = field(default_factory=dict)
    # request_id -> log-probabilities of token_ids[p + 1] for each computed position p of this chunk
    # with score_start <= p + 1 < len(token_ids), in position order (scoring requests only)
    score_logprobs: dict[str, list[float]] = field(default_factory=dict)
    # request_id -> for a scoring parent whose last prompt token was computed this step: the
    # log-probability of each continuation's first token after the prompt, in continuation order
    first_token_logprobs: dict[str, list[float]] = field(default_factory=dict)
    # request_id -> the pooled vector of a POOL request whose last prompt row was computed this step
    pooled: dict[str, Any] = field(default_factory=dict)
