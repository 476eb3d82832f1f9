"""Continuation scoring, in one place: how a scoring request is split, which rows it needs logits
for, how those logits become log-probabilities, and what its results do to it. Plain Python: the
log-probabilities themselves are computed by bulkrun.engine.worker.score_logprobs.

A scoring request ("parent") computes its whole prompt; its last prompt row scores every
continuation's first token. Each continuation longer than one token gets a child request (prompt +
continuation) that starts from the parent's full blocks, and a copy of its last partial one, and
scores cont[1:]. The parent finishes when its last child does.

Fixed points: the scheduler calls `start_scoring` when a scoring request arrives and `apply_results`
when a step's results land; the step-input builder calls `score_rows` per scheduled chunk and the
runner calls `worker.score_logprobs.score_logprobs` once per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from bulkrun.engine.core.request import Request, RequestKind
from bulkrun.engine.core.runner_output import RunnerOutput


@dataclass(slots=True, eq=False)
class ScoringState:
    """What a scoring request carries beside a generating one's bookkeeping (Request.scoring)."""

    compute_limit: int | None = None  # stop computing here (None: compute all tokens)
    score_start: int | None = None  # child: the runner returns logprob of token_ids[i] for i >= this
    score_logprobs: list[float] = field(default_factory=list)  # child: cont[1:], in order
    parent: Request | None = None  # child: the parent it scores for
    # parent: its children in continuation order (only continuations longer than one token get one;
    # the parent scores every first token) and how many are still live
    children: list[Request] = field(default_factory=list)
    num_live_children: int = 0
    first_token_ids: list[int] | None = None  # parent: each continuation's first token
    first_token_logprobs: list[float] = field(default_factory=list)  # same order, from the runner
    continuation_lengths: list[int] = field(default_factory=list)


# ---- scheduler side ------------------------------------------------------------------------------


def start_scoring(parent: Request, continuations: list[list[int]], unique_id: Callable[[str], str]) -> None:
    """Make `parent` a scoring parent and create its children (not yet queued)."""
    prompt_len = parent.num_prompt_tokens
    parent.kind = RequestKind.SCORE_PARENT
    state = parent.scoring = ScoringState(
        compute_limit=prompt_len,
        first_token_ids=[int(cont[0]) for cont in continuations],
        continuation_lengths=[len(cont) for cont in continuations],
    )
    state.children = [
        Request(
            unique_id(f"{parent.request_id}::cont{i}"),
            parent.params,
            parent.token_ids + [int(t) for t in cont],
            prompt_len,
            kind=RequestKind.SCORE_CHILD,
            scoring=ScoringState(
                compute_limit=prompt_len + len(cont) - 1, score_start=prompt_len + 1, parent=parent
            ),
        )
        for i, cont in enumerate(continuations)
        if len(cont) > 1
    ]


def positions_needed(num_prompt_tokens: int, continuations: list[list[int]]) -> int:
    """Positions the longest child computes (the last continuation token is scored, not computed)."""
    return num_prompt_tokens + max(len(c) for c in continuations) - 1


class ScoringEvent(Enum):
    NONE = "none"  # more chunks to come
    FORK = "fork"  # the parent's prompt is done: hand its blocks to the children and queue them
    CHILD_DONE = "child_done"  # a child scored its last token (the parent may be done too)
    PARENT_DONE = "parent_done"  # the parent is finished ("scored")


def apply_results(req: Request, end: int, result: RunnerOutput) -> ScoringEvent:
    """Record a scoring request's results for the chunk that computed up to position `end`."""
    state = req.scoring
    if req.kind is RequestKind.SCORE_CHILD:
        scores = result.score_logprobs.get(req.request_id)
        if scores:
            state.score_logprobs.extend(scores)
        return ScoringEvent.CHILD_DONE if end >= state.compute_limit else ScoringEvent.NONE
    if end < state.compute_limit:
        return ScoringEvent.NONE
    state.first_token_logprobs = result.first_token_logprobs[req.request_id]
    return ScoringEvent.FORK if state.children else ScoringEvent.PARENT_DONE


def parent_of(req: Request) -> Request | None:
    return None if req.scoring is None else req.scoring.parent


def children_of(req: Request) -> list[Request]:
    return [] if req.scoring is None else req.scoring.children


def child_finished(child: Request) -> bool:
    """Count a finished child off its parent; True when it was the last."""
    parent = child.scoring.parent.scoring
    parent.num_live_children -= 1
    return parent.num_live_children == 0


def forget_results(req: Request) -> None:
    """A preempted scoring request recomputes, and rescores, from scratch."""
    if req.scoring is not None:
        req.scoring.score_logprobs.clear()
        req.scoring.first_token_logprobs.clear()


def continuation_logprobs(parent: Request) -> list[list[float]]:
    """Per continuation, the log-probability of each of its tokens (the first from the parent's
    last prompt row, the rest from the continuation's child)."""
    state = parent.scoring
    children = iter(state.children)
    out = []
    for first, n in zip(state.first_token_logprobs, state.continuation_lengths, strict=True):
        out.append([first, *next(children).scoring.score_logprobs] if n > 1 else [first])
    return out


# ---- runner side ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ScoreSpan:
    request: Request
    first_row: int  # into the scored rows (then shifted past the sampled rows)
    targets: list[int]  # token_ids[p + 1] for each scored position p, in position order


@dataclass(slots=True)
class ScoreRows:
    """A step's logits rows for scoring, after the sampled rows: the spans' rows, then one row per
    scoring parent whose last prompt row is computed this step."""

    spans: list[ScoreSpan] = field(default_factory=list)
    span_rows: list[int] = field(default_factory=list)  # packed rows, in span order
    first_token_requests: list[Request] = field(default_factory=list)
    first_token_rows: list[int] = field(default_factory=list)
    # then one row per POOL request whose last prompt row is computed this step (its final hidden
    # state is pooled: worker/pooling.py)
    pool_requests: list[Request] = field(default_factory=list)
    pool_rows: list[int] = field(default_factory=list)

    def add(self, r: Request, start: int, n: int, row: int) -> None:
        """The chunk of `r` computing positions start..start+n-1 from packed row `row`."""
        state = r.scoring
        if state.score_start is not None:
            # positions p of this chunk with score_start <= p + 1 < len(token_ids)
            lo, hi = max(start, state.score_start - 1), min(start + n, len(r.token_ids) - 1)
            if hi > lo:
                self.spans.append(ScoreSpan(r, len(self.span_rows), r.token_ids[lo + 1 : hi + 1]))
                self.span_rows.extend(range(row + lo - start, row + hi - start))
        if state.first_token_ids is not None and start + n == len(r.token_ids):
            self.first_token_rows.append(row + n - 1)
            self.first_token_requests.append(r)
        if r.pooling is not None and start + n == len(r.token_ids):
            self.pool_rows.append(row + n - 1)
            self.pool_requests.append(r)

    def shift(self, num_sample_rows: int) -> None:
        for span in self.spans:
            span.first_row += num_sample_rows

    @property
    def rows(self) -> list[int]:
        return self.span_rows + self.first_token_rows + self.pool_rows
