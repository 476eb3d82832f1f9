"""What the engine hands back: finished requests and per-step figures. Plain Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"  # "stop" | "length" | "error" | "scored" | "pooled"
    logprobs: list[float] | None = None  # one per generated token when params.logprobs
    # Scoring requests: per continuation, the log-probability of each of its tokens.
    continuation_logprobs: list[list[float]] | None = None
    embedding: Any = None  # pooling requests: the vector (a float32 numpy array), finish_reason "pooled"
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # set with finish_reason == "error" (e.g. can never fit)

    @property
    def scores(self) -> list[float] | None:
        """Sum of token log-probabilities per continuation."""
        if self.continuation_logprobs is None:
            return None
        return [sum(lp) for lp in self.continuation_logprobs]


@dataclass(slots=True)
class StepStats:
    """Figures of one engine step, for progress bars and reports."""

    num_scheduled_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_preempted: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    kv_blocks_touched: int = 0  # ever handed out: what the cache's (lazily mapped) memory holds
    prefix_cache_hit_tokens: int = 0  # prompt tokens newly admitted from the cache this step
    num_finished: int = 0
    num_generated_tokens: int = 0  # rows that sample a token this step
