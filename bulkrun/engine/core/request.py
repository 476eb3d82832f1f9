"""One sequence's bookkeeping: its tokens, how many have KV in the cache, its blocks. No torch."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from bulkrun.engine.core.params import EngineRequest, SamplingParams

if TYPE_CHECKING:
    from bulkrun.engine.core.scoring import ScoringState


class RequestStatus(Enum):
    WAITING = "waiting"  # new, or preempted (then num_computed_tokens == 0 and no blocks)
    RUNNING = "running"
    FORKED = "forked"  # scoring parent: its children compute, it waits for them
    FINISHED = "finished"


class RequestKind(Enum):
    GENERATE = "generate"  # computes all its tokens, then samples one new token per step
    # computes the whole prompt and scores every continuation's first token from its last row;
    # then forks one child per continuation longer than one token
    SCORE_PARENT = "score_parent"
    SCORE_CHILD = "score_child"  # prompt + one continuation; scores cont[1:], samples nothing
    # computes the whole prompt; the final hidden state of its last row, pooled, is its output
    # (a decoder embedder: last-token pooling), no token is sampled
    POOL = "pool"


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    params: SamplingParams
    # prompt + generated so far (scoring child: prompt + continuation); read it as token_ids: while
    # the request runs, its newest tokens may still wait in its RunningBatch slot
    _token_list: list[int]
    num_prompt_tokens: int
    kind: RequestKind = RequestKind.GENERATE
    status: RequestStatus = RequestStatus.WAITING
    # num_computed_tokens and num_pending_tokens (properties below) while not running
    _computed: int = 0
    _pending: int = 0
    # while running: its row in the scheduler's RunningBatch, which then holds those two counters
    slot: int = -1
    batch: Any = None
    block_table: list[int] = field(default_factory=list)  # physical block ids, append-only
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks, lazily
    num_hashed_blocks: int = 0  # leading blocks of block_table already offered to the prefix cache
    scoring: ScoringState | None = None  # a scoring parent's or child's state (engine.core.scoring)
    output_logprobs: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    admitted: bool = False  # set at its first admission (a preempted or requeued one is admitted again)
    num_preemptions: int = 0
    # its KV is computed on LongRoPE's long factors (the model's long rotary rows): a generating
    # request once it holds more than the model's long_rope_after tokens, a scoring or pooling one
    # when the most positions it computes exceed it (scheduler); it only ever turns on
    long_rope: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "error" | "scored"
    error: str | None = None
    # Generating: tokens that end it (stop ids, and EOS unless ignored) and the length at which it
    # stops (prompt + max_tokens, capped by the context); set by the scheduler at arrival.
    stop_token_set: frozenset[int] = frozenset()
    length_limit: int = 0
    grammar: object | None = None  # a constrained request's grammar.GrammarMatcher (set by the engine)
    pooling: object | None = None  # a POOL request's params.PoolingParams
    embedding: Any = None  # a POOL request's vector, once its last prompt row is computed

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache or is being computed by a scheduled step (advanced when
        the step is scheduled, so the next step can be scheduled before this one's results land)."""
        return self._computed if self.batch is None else int(self.batch.computed[self.slot])

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        if self.batch is None:
            self._computed = value
        else:
            self.batch.computed[self.slot] = value

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to be sampled by scheduled steps whose results have not landed (at most 2: the
        step in flight and the one scheduled ahead of it); the input at such a position comes
        from the runner, which has the previous step's tokens."""
        return self._pending if self.batch is None else int(self.batch.pending[self.slot])

    @num_pending_tokens.setter
    def num_pending_tokens(self, value: int) -> None:
        if self.batch is None:
            self._pending = value
        else:
            self.batch.pending[self.slot] = value

    @property
    def token_ids(self) -> list[int]:
        """Prompt + generated so far. The steady decode step appends each running request's token
        to its batch slot (one vector operation for the whole batch); they join this list when it
        is read, when the slot's buffer fills, or when the request leaves the batch."""
        batch = self.batch
        if batch is not None and batch.unsynced[self.slot]:
            batch.sync_tokens(self)
        return self._token_list

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def generates(self) -> bool:
        return self.kind is RequestKind.GENERATE

    @property
    def compute_limit(self) -> int | None:
        """Where a scoring request stops computing (None: all its tokens, then it samples)."""
        return None if self.scoring is None else self.scoring.compute_limit

    @property
    def num_target_tokens(self) -> int:
        """How many tokens must have KV before this request's work in the step is done."""
        limit = self.compute_limit
        return len(self.token_ids) + self.num_pending_tokens if limit is None else limit

    @property
    def num_tokens_without_logits(self) -> int:
        """Leading tokens none of whose logits are needed: a prefix-cache hit may cover them."""
        score_start = None if self.scoring is None else self.scoring.score_start
        if score_start is not None:  # scoring child: the row before score_start is scored
            return score_start - 1
        return len(self.token_ids) - 1  # generating or scoring first tokens: the last prompt row

    @property
    def num_remaining_tokens(self) -> int:
        return self.num_target_tokens - self.num_computed_tokens

    def continuation_logprobs(self) -> list[list[float]]:
        from bulkrun.engine.core.scoring import continuation_logprobs

        return continuation_logprobs(self)


def validate_engine_request(req: EngineRequest) -> None:
    """Raise ValueError for a request no engine could serve (malformed, not merely too long)."""
    if not isinstance(req.request_id, str) or not req.request_id:
        raise ValueError(f"request_id must be a non-empty string, got {req.request_id!r}")
    if len(req.prompt_token_ids) == 0:
        raise ValueError(f"request {req.request_id!r}: the prompt has no tokens")
    _check_token_ids(req.request_id, "prompt", req.prompt_token_ids)
    if req.continuations is None:
        return
    if len(req.continuations) == 0:
        raise ValueError(f"request {req.request_id!r}: continuations is an empty list")
    for i, cont in enumerate(req.continuations):
        if len(cont) == 0:
            raise ValueError(f"request {req.request_id!r}: continuation {i} has no tokens")
        _check_token_ids(req.request_id, f"continuation {i}", cont)


def _check_token_ids(request_id: str, what: str, token_ids: list[int]) -> None:
    for t in token_ids:
        if (type(t) is not int and not isinstance(t, numbers.Integral)) or t < 0:
            raise ValueError(f"request {request_id!r}: {what} has an invalid token id {t!r}")
