"""Iteration-level scheduler: every step, who computes how many tokens. No torch.

There is no prefill phase or decode phase: each running request is given up to
`num_remaining_tokens` tokens within the step's token budget, so long prompts arrive in chunks
interleaved with everyone else's decode tokens, and a prefix-cache hit simply starts further along.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from bulkrun.engine.block_pool import BlockPool, extend_block_hashes
from bulkrun.engine.params import EngineRequest
from bulkrun.engine.request import Request, RequestKind, RequestStatus, validate_engine_request
from bulkrun.engine.runner_output import RunnerOutput


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


class Scheduler:
    """Decides, every step, which requests compute how many tokens, and applies the results.

    Order of service: running decodes first (one token each), then prompt chunks of running
    requests still prefilling, then newly admitted waiting requests, all within the step's token
    budget. When blocks run out the most recently admitted running request is preempted: it loses
    its blocks, keeps its tokens, and goes back to the front of the waiting queue.
    """

    def __init__(
        self,
        pool: BlockPool,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
    ):
        self.pool = pool
        self.block_size = pool.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        # A sequence can never hold more tokens than the context or the whole cache allow.
        self.max_seq_len = min(max_model_len, pool.num_blocks * pool.block_size)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is the first to be preempted
        self._failed: list[tuple[Request, str]] = []  # found at add time, reported next step
        self._finished_early: list[Request] = []  # nothing to compute (max_tokens == 0)
        self._released_ids: list[str] = []
        self._live_ids: set[str] = set()
        self._arrivals = 0
        self.num_preemptions = 0
        self.num_prefix_hit_tokens = 0  # tokens served from the prefix cache, all admissions

    # ---- intake -------------------------------------------------------------------------------

    def add_request(self, req: EngineRequest) -> Request:
        """Queue a request; raises ValueError when it is malformed (can-never-fit is not raised:
        it is reported as failed by the next schedule())."""
        validate_engine_request(req)
        if req.request_id in self._live_ids:
            raise ValueError(f"request id {req.request_id!r} is already in the engine")
        prompt = [int(t) for t in req.prompt_token_ids]
        request = Request(req.request_id, req.params, prompt, len(prompt), self._next_arrival())
        self._live_ids.add(req.request_id)
        if req.continuations is not None:
            self._setup_scoring(request, req.continuations)
        problem = self._never_fits(request, req.continuations)
        if problem is not None:
            self._failed.append((request, problem))
        elif request.generates and req.params.max_tokens == 0:
            request.finish_reason = "length"
            self._finished_early.append(request)
        else:
            self.waiting.append(request)
        return request

    def _next_arrival(self) -> int:
        self._arrivals += 1
        return self._arrivals

    def _setup_scoring(self, parent: Request, continuations: list[list[int]]) -> None:
        # The parent computes the whole prompt; its last row scores every continuation's first
        # token. Only longer continuations need a child, which scores cont[1:] on top of the
        # parent's full blocks (recomputing the partial last block and cont[:-1]).
        prompt_len = parent.num_prompt_tokens
        parent.kind = RequestKind.SCORE_PARENT
        parent.compute_limit = prompt_len
        parent.first_token_ids = [int(cont[0]) for cont in continuations]
        parent.continuation_lengths = [len(cont) for cont in continuations]
        parent.children = [
            Request(
                self._unique_id(f"{parent.request_id}::cont{i}"),
                parent.params,
                parent.token_ids + [int(t) for t in cont],
                prompt_len,
                parent.arrival,
                kind=RequestKind.SCORE_CHILD,
                compute_limit=prompt_len + len(cont) - 1,
                score_start=prompt_len + 1,
                parent=parent,
            )
            for i, cont in enumerate(continuations)
            if len(cont) > 1
        ]

    def _unique_id(self, request_id: str) -> str:
        while request_id in self._live_ids:
            request_id += "'"
        self._live_ids.add(request_id)
        return request_id

    def _never_fits(self, req: Request, continuations: list[list[int]] | None) -> str | None:
        n = req.num_prompt_tokens
        if continuations is not None:
            n += max(len(c) for c in continuations) - 1  # the last token is scored, not computed
            what = "prompt + longest continuation"
        else:
            what = "prompt"
        if n > self.max_model_len:
            return f"{what} needs {n} positions; the model's context is {self.max_model_len} tokens"
        if n > self.max_seq_len:
            blocks = -(-n // self.block_size)
            return (
                f"{what} needs {blocks} KV-cache blocks of {self.block_size} tokens; "
                f"the whole cache has {self.pool.num_blocks}"
            )
        return None

    # ---- queries --------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._failed or self._finished_early)

    # ---- one step -------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(failed=self._failed, released_request_ids=self._released_ids)
        self._failed, self._released_ids = [], []
        for req, why in out.failed:
            self._finish(req, "error", error=why)
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()  # id() of requests scheduled this step
        chunks: list[Request] = []  # running requests with more than one token to compute
        running = self.running
        i = 0
        while i < len(running) and budget > 0:  # decodes first, oldest first
            req = running[i]
            i += 1
            if req.num_remaining_tokens != 1:
                chunks.append(req)
                continue
            if self._grow_or_preempt(req, 1, scheduled_ids, out):
                budget -= self._schedule(req, 1, scheduled_ids, out)
            else:  # it is the newest and nothing is left to take from: it yields itself
                running.pop()
                self._preempt(req, out)
                break
        for req in chunks:  # then prompt chunks of requests already running
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted above
            n = min(req.num_remaining_tokens, budget)
            if not self._grow_or_preempt(req, n, scheduled_ids, out):
                n = min(n, self._room_for(req))  # what the free blocks allow
                if n <= 0 or not self._grow(req, n):
                    continue
            budget -= self._schedule(req, n, scheduled_ids, out)
        if not out.preempted:
            self._admit(budget, scheduled_ids, out)
        return out

    def _schedule(self, req: Request, n: int, scheduled_ids: set[int], out: SchedulerOutput) -> int:
        sample = req.generates and req.num_computed_tokens + n == len(req.token_ids)
        out.scheduled.append(ScheduledRequest(req, n, sample))
        out.num_scheduled_tokens += n
        scheduled_ids.add(id(req))
        return n

    def _grow(self, req: Request, n: int) -> bool:
        """Make req's block table cover n more computed tokens; False if blocks are short."""
        need = -(-(req.num_computed_tokens + n) // self.block_size) - len(req.block_table)
        if need <= 0:
            return True
        blocks = self.pool.allocate(need)
        if blocks is None:
            return False
        req.block_table.extend(blocks)
        return True

    def _room_for(self, req: Request) -> int:
        slots = (len(req.block_table) + self.pool.num_free_blocks) * self.block_size
        return slots - req.num_computed_tokens

    def _grow_or_preempt(self, req: Request, n: int, scheduled_ids: set[int], out: SchedulerOutput) -> bool:
        """Grow req, preempting the newest running requests not yet scheduled this step."""
        while not self._grow(req, n):
            victim = self.running[-1]
            if victim is req or id(victim) in scheduled_ids:
                return self._reclaim_from_waiting() and self._grow(req, n)
            self.running.pop()
            self._preempt(victim, out)
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self._release_blocks(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        req.score_logprobs.clear()  # a scoring child recomputes (and rescores) from scratch
        req.first_token_logprobs.clear()  # as does a scoring parent
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        out.preempted.append(req)
        self._released_ids.append(req.request_id)

    def _release_blocks(self, req: Request) -> None:
        self.pool.free(reversed(req.block_table))  # tail first: evicted before shared prefixes
        req.block_table = []
        req.num_computed_tokens = 0
        req.num_hashed_blocks = 0

    def _reclaim_from_waiting(self) -> bool:
        """Free blocks held by waiting requests (forked scoring children): the last resort when
        the requests that must progress cannot otherwise get blocks. True if any were freed."""
        freed = False
        for req in self.waiting:
            if req.block_table:
                self._release_blocks(req)
                freed = True
        return freed

    # ---- admission ------------------------------------------------------------------------------

    def _admit(self, budget: int, scheduled_ids: set[int], out: SchedulerOutput) -> None:
        bs = self.block_size
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            hits = self._prefix_hits(req)
            hit_tokens = len(hits) * bs
            remaining = req.num_remaining_tokens - hit_tokens
            n = min(remaining, budget)
            computed_after = req.num_computed_tokens + hit_tokens + n
            need = -(-computed_after // bs) - len(req.block_table) - len(hits)
            if need > self.pool.num_free_after_sharing(hits):
                # Waiting scoring children may hold shared blocks; with nothing running they
                # are all that stands in the way, and the head always fits the cache alone.
                if self.running or not self._reclaim_from_waiting():
                    return
                continue
            self.waiting.popleft()
            self._take_hits(req, hits, out)  # hits stop short of a row whose logits are needed
            self._grow(req, n)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            budget -= self._schedule(req, n, scheduled_ids, out)

    def _prefix_hits(self, req: Request) -> list[int]:
        """Cached blocks that extend req's computed prefix. Capped so that every token whose
        logits are needed (the last one when generating, the scored ones) is recomputed."""
        if not self.pool.enable_prefix_caching:
            return []
        if req.kind is RequestKind.SCORE_CHILD:
            limit = req.score_start - 1
        else:  # generating or scoring first tokens: the last prompt row is recomputed
            limit = len(req.token_ids) - 1
        start, stop = len(req.block_table), limit // self.block_size
        if stop <= start:
            return []
        extend_block_hashes(req.block_hashes, req.token_ids, stop, self.block_size)
        return self.pool.lookup_prefix(req.block_hashes[start:stop])

    def _take_hits(self, req: Request, hits: list[int], out: SchedulerOutput) -> None:
        if not hits:
            return
        self.pool.share(hits)
        req.block_table.extend(hits)
        hit_tokens = len(hits) * self.block_size
        req.num_computed_tokens += hit_tokens
        req.num_hashed_blocks = len(req.block_table)
        if req.num_preemptions == 0:
            req.num_cached_tokens = hit_tokens
        out.num_prefix_hit_tokens += hit_tokens
        self.num_prefix_hit_tokens += hit_tokens

    def _fork(self, parent: Request) -> None:
        """The parent's full blocks now hold the prompt prefix: hand them to the children (by
        reference count, independent of the prefix cache) and queue the children first. The
        partial last block is the parent's alone and is freed; each child recomputes it."""
        shared = parent.block_table[: parent.num_computed_tokens // self.block_size]
        for child in parent.children:
            self.pool.share(shared)
            child.block_table = list(shared)
            child.num_computed_tokens = len(shared) * self.block_size
            child.num_hashed_blocks = len(shared)
        self._release_blocks(parent)
        parent.status = RequestStatus.FORKED
        parent.num_live_children = len(parent.children)
        self.waiting.extendleft(reversed(parent.children))

    # ---- results --------------------------------------------------------------------------------

    def update(self, out: SchedulerOutput, result: RunnerOutput) -> list[Request]:
        """Apply the runner's results of the step `out`; return the requests that finished, in
        completion order (scoring requests appear once, as the parent)."""
        finished = [req for req, _ in out.failed]
        finished += self._finished_early
        self._finished_early = []
        left_running = False
        for item in out.scheduled:
            req = item.request
            req.num_computed_tokens += item.num_tokens
            if self.pool.enable_prefix_caching:
                self._publish_full_blocks(req)
            if item.sample:
                self._append_token(req, result, finished)
            elif req.kind is RequestKind.SCORE_CHILD:
                self._add_scores(req, result, finished)
            elif req.kind is RequestKind.SCORE_PARENT and req.num_remaining_tokens == 0:
                self._end_parent_prompt(req, result, finished)
            left_running = left_running or req.status is not RequestStatus.RUNNING
        if left_running:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return finished

    def _publish_full_blocks(self, req: Request) -> None:
        full = req.num_computed_tokens // self.block_size
        if full <= req.num_hashed_blocks:
            return
        extend_block_hashes(req.block_hashes, req.token_ids, full, self.block_size)
        for i in range(req.num_hashed_blocks, full):
            self.pool.cache_block(req.block_table[i], req.block_hashes[i])
        req.num_hashed_blocks = full

    def _append_token(self, req: Request, result: RunnerOutput, finished: list[Request]) -> None:
        token = result.sampled[req.request_id]
        req.token_ids.append(token)
        params = req.params
        if params.logprobs:
            req.output_logprobs.append(result.sampled_logprobs[req.request_id])
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif req.num_output_tokens >= params.max_tokens or len(req.token_ids) >= self.max_seq_len:
            reason = "length"
        else:
            return
        self._finish(req, reason)
        finished.append(req)

    def _end_parent_prompt(self, parent: Request, result: RunnerOutput, finished: list[Request]) -> None:
        parent.first_token_logprobs = result.first_token_logprobs[parent.request_id]
        if parent.children:
            self._fork(parent)
        else:  # single-token continuations only: scored by the prompt alone
            self._finish(parent, "scored")
            finished.append(parent)

    def _add_scores(self, child: Request, result: RunnerOutput, finished: list[Request]) -> None:
        scores = result.score_logprobs.get(child.request_id)
        if scores:
            child.score_logprobs.extend(scores)
        if child.num_remaining_tokens > 0:
            return
        self._finish(child, "scored")
        parent = child.parent
        parent.num_live_children -= 1
        if parent.num_live_children == 0:
            self._finish(parent, "scored")
            finished.append(parent)

    def fail_stalled(self) -> list[Request]:
        """Last-resort guard against a hang: if a step could schedule nothing although work is
        left, fail the request at the head of the line (with its scoring family)."""
        req = self.waiting[0] if self.waiting else self.running[-1]
        target = req.parent or req
        why = "the scheduler could not make progress with this request (internal error)"
        for member in (*target.children, target):
            if not member.is_finished:
                self._drop_from_queues(member)
                self._finish(member, "error", error=why)
        return [target]

    def finish_request(self, req: Request, reason: str) -> None:
        """End a request from outside (a stop string matched); frees its blocks at once."""
        if req.is_finished:
            req.finish_reason = reason
            return
        self._drop_from_queues(req)
        self._finish(req, reason)

    def _drop_from_queues(self, req: Request) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING and req in self.waiting:
            self.waiting.remove(req)

    def _finish(self, req: Request, reason: str, error: str | None = None) -> None:
        if req.block_table:
            self._release_blocks(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.error = error
        self._live_ids.discard(req.request_id)
        for child in req.children:
            self._live_ids.discard(child.request_id)
        self._released_ids.append(req.request_id)
