"""Iteration-level scheduler: every step, who computes how many tokens. No torch.

There is no prefill phase or decode phase: each running request is given up to
`num_remaining_tokens` tokens within the step's token budget, so long prompts arrive in chunks
interleaved with everyone else's decode tokens, and a prefix-cache hit simply starts further along.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bulkrun.engine.request import Request


@dataclass(slots=True)
class ScheduledRequest:
    """Compute token_ids[num_computed_tokens : num_computed_tokens + num_tokens] of `request`.

    `sample` is True when this chunk reaches the end of token_ids and the request generates: the
    runner then samples one new token for it. The request's num_computed_tokens is advanced only
    after the runner has executed the step (Scheduler.update), so the runner reads it unchanged.
    """

    request: Request
    num_tokens: int
    sample: bool


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)  # lost their blocks this step
    failed: list[tuple[Request, str]] = field(default_factory=list)  # can never fit: (request, why)
    # ids of requests that left since the previous step (finished, failed or preempted), so a
    # runner that keeps per-request state can drop it
    released_request_ids: list[str] = field(default_factory=list)
    num_scheduled_tokens: int = 0
    num_prefix_hit_tokens: int = 0  # tokens newly served from the prefix cache at admission
