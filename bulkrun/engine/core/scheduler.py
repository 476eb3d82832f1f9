"""Iteration-level scheduler: every step, who computes how many tokens. No torch.

There is no prefill phase or decode phase: each running request is given up to
`num_remaining_tokens` tokens within the step's token budget, so long prompts arrive in chunks
interleaved with everyone else's decode tokens, and a prefix-cache hit simply starts further along.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from operator import attrgetter

import numpy as np

from bulkrun.engine.core import scoring
from bulkrun.engine.core.block_pool import BlockPool
from bulkrun.engine.core.kv_cache_manager import KVCacheManager
from bulkrun.engine.core.params import EngineRequest
from bulkrun.engine.core.request import Request, RequestKind, RequestStatus, validate_engine_request
from bulkrun.engine.core.runner_output import RunnerOutput
from bulkrun.engine.core.running_batch import RunningBatch
from bulkrun.engine.core.scoring import ScoringEvent


class SchedulerOutput:
    """One step's work, plus what changed in the queues. Its one shape: parallel per-row lists
    (row i computes token_ids[starts[i] : starts[i] + num_tokens[i]] of requests[i], and samples a
    new token when samples[i]), cheap to build and to read at 1,000 rows; array() reads a list as
    numpy once the scheduler has finished the step."""

    __slots__ = (
        "requests", "starts", "num_tokens", "samples", "preempted", "failed", "released_request_ids",
        "num_scheduled_tokens", "num_decode_tokens", "num_prefix_hit_tokens", "step_index",
        "slots", "epochs", "batch", "constrained", "kv_copies", "_arrays",
    )  # fmt: skip

    def __init__(self, rows: Iterable[tuple[Request, int, bool]] = (), **fields):
        """`rows`: (request, num_tokens, sample) for a step built by hand; each row starts at the
        request's num_computed_tokens. The scheduler builds its steps with add()."""
        self.requests: list[Request] = []
        self.starts: list[int] = []  # first position each row computes
        self.num_tokens: list[int] = []
        self.samples: list[bool] = []
        self.preempted: list[Request] = fields.pop("preempted", [])  # lost their blocks this step
        # can never fit: (request, why)
        self.failed: list[tuple[Request, str]] = fields.pop("failed", [])
        # ids of requests that left since the previous step (finished, failed or preempted), so a
        # runner that keeps per-request state can drop it
        self.released_request_ids: list[str] = fields.pop("released_request_ids", [])
        self.num_decode_tokens = 0  # rows computing one token past the prompt
        self.num_prefix_hit_tokens = 0  # tokens newly served from the prefix cache at admission
        # (source block, destination block, tokens): the leading slots of a block a request shares
        # (a cached block, or a forked scoring parent's last one), copied before the step writes
        # any KV (the source is still intact then)
        self.kv_copies: list[tuple[int, int, int]] = []
        self.step_index = fields.pop("step_index", 0)
        # set by the Scheduler: each row's slot in its RunningBatch, and the slot's epoch then
        self.slots: list[int] | None = None
        self.epochs: np.ndarray | None = None
        self.batch: RunningBatch | None = None
        # set by the Engine: whether any request it holds is constrained (None: unknown, look)
        self.constrained: bool | None = None
        self._arrays: dict[str, np.ndarray] = {}
        if fields:
            raise TypeError(f"unknown SchedulerOutput fields: {sorted(fields)}")
        self.num_scheduled_tokens = 0
        for req, n, sample in rows:
            self.add(req, req.num_computed_tokens, n, sample)

    def rows(self) -> Iterable[tuple[Request, int, int, bool]]:
        """(request, start, num_tokens, sample) per row, in row order."""
        return zip(self.requests, self.starts, self.num_tokens, self.samples, strict=True)

    def __len__(self) -> int:
        return len(self.requests)

    def array(self, name: str) -> np.ndarray:
        """The per-row list `name` (slots, starts, num_tokens or samples) as a numpy array, made
        once per step: the lists are final once the scheduler returns. Read-only by convention."""
        arrays = self._arrays
        if name not in arrays:
            arrays[name] = np.asarray(getattr(self, name), dtype=bool if name == "samples" else np.int64)
        return arrays[name]

    def add(self, req: Request, start: int, n: int, sample: bool) -> None:
        self._arrays = {}  # a row after the arrays were made: they are made again when asked
        self.requests.append(req)
        self.starts.append(start)
        self.num_tokens.append(n)
        self.samples.append(sample)
        self.num_scheduled_tokens += n
        if n == 1 and start >= req.num_prompt_tokens:
            self.num_decode_tokens += 1


class Scheduler:
    """Decides, every step, which requests compute how many tokens, and applies the results.

    Order of service: running decodes first (one token each), then prompt chunks of running
    requests still prefilling, then newly admitted waiting requests, all within the step's token
    budget. When blocks run out the most recently admitted running request is preempted: it loses
    its blocks, keeps its tokens, and goes back to the front of the waiting queue.

    A scheduled chunk advances the request's num_computed_tokens at once (and marks its sampled
    token pending), so the next step can be scheduled before this one's results land (async
    scheduling); results for a request preempted or finished in between are dropped.

    LongRoPE (long_rope_after = N): as transformers' Phi-3, a sequence of at most N tokens runs on
    the short factors and a longer one on the long factors at every position. A generating request
    that grows past N gives its blocks back and recomputes from the front of the waiting queue on
    the long ones; its prefix-cache chain is the long factors' own (kv_cache_manager).
    """

    def __init__(
        self,
        pool: BlockPool,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
        long_rope_after: int | None = None,
    ):
        self.pool = pool
        self.kv = KVCacheManager(pool)
        self.block_size = pool.block_size
        self.batch = RunningBatch(pool.block_size, pool.enable_prefix_caching, max_rows=max_num_seqs)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        # A sequence can never hold more tokens than the context or the whole cache allow.
        self.max_seq_len = min(max_model_len, pool.num_blocks * pool.block_size)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.long_rope_after = long_rope_after
        self._stop_ids: set[int] = set(self.eos_token_ids)  # every running request's stop ids, and more
        self._stop_id_array = np.array(sorted(self._stop_ids), np.int64)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is the first to be preempted
        self._failed: list[tuple[Request, str]] = []  # found at add time, reported next step
        self._finished_early: list[Request] = []  # nothing to compute (max_tokens == 0)
        self._released_ids: list[str] = []
        self._live_ids: set[str] = set()
        self._steps = 0
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
        request = Request(req.request_id, req.params, prompt, len(prompt))
        self._live_ids.add(req.request_id)
        params = req.params
        request.stop_token_set = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else self.eos_token_ids
        )
        request.length_limit = min(len(prompt) + params.max_tokens, self.max_seq_len)
        if not request.stop_token_set <= self._stop_ids:
            self._stop_ids |= request.stop_token_set
            self._stop_id_array = np.array(sorted(self._stop_ids), np.int64)
        if req.continuations is not None:
            scoring.start_scoring(request, req.continuations, self._unique_id)
        elif req.pooling is not None:
            # computes its prompt and stops there, as a scoring parent does: the same row bookkeeping
            request.kind, request.pooling = RequestKind.POOL, req.pooling
            request.scoring = scoring.ScoringState(compute_limit=len(prompt))
        if self.long_rope_after is not None and not request.generates:
            # one set of factors for the whole scoring family: the long ones if any of it outgrows N
            request.long_rope = self._positions(request, req.continuations) > self.long_rope_after
            for child in scoring.children_of(request):
                child.long_rope = request.long_rope
        problem = self._never_fits(request, req.continuations)
        if problem is not None:
            self._failed.append((request, problem))
        elif request.generates and params.max_tokens == 0:
            request.finish_reason = "length"
            self._finished_early.append(request)
        else:
            self.waiting.append(request)
        return request

    def _unique_id(self, request_id: str) -> str:
        while request_id in self._live_ids:
            request_id += "'"
        self._live_ids.add(request_id)
        return request_id

    @staticmethod
    def _positions(req: Request, continuations: list[list[int]] | None) -> int:
        """The most positions the request (with its scoring children) computes."""
        if continuations is None:
            return req.num_prompt_tokens
        return scoring.positions_needed(req.num_prompt_tokens, continuations)

    def _never_fits(self, req: Request, continuations: list[list[int]] | None) -> str | None:
        n = self._positions(req, continuations)
        what = "prompt" if continuations is None else "prompt + longest continuation"
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
        self._steps += 1
        step = self._steps
        out = SchedulerOutput(failed=self._failed, released_request_ids=self._released_ids, step_index=step)
        out.slots, out.batch = [], self.batch
        self._failed, self._released_ids = [], []
        self.kv.in_flight.clear()
        out.kv_copies, self.kv.pending_copies = self.kv.pending_copies, []  # forks' copies first
        for req, why in out.failed:
            self._finish(req, "error", error=why)
        if self.long_rope_after is not None and self.running:
            self._requeue_outgrowing_short_rope()
        budget = self.max_num_batched_tokens
        chunks = self._schedule_decodes(out) if self.running else []
        budget -= len(out.requests)
        for req in chunks:  # then prompt chunks of requests already running
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted above
            n = min(req.num_remaining_tokens, budget)
            if not self._grow_or_preempt(req, n, out):
                n = min(n, self.kv.room_for(req))  # what the free blocks allow
                if n <= 0 or self.kv.allocate_slots(req, n) is None:
                    continue
            budget -= self._schedule(req, n, out)
        if not out.preempted:
            self._admit(budget, out)
        out.epochs = self.batch.epoch[out.array("slots")]
        return out

    def _schedule_decodes(self, out: SchedulerOutput) -> list[Request]:
        """Schedule every running request that computes exactly one token (decodes first, oldest
        first, within the budget) as vector operations over the RunningBatch; Python runs only for
        the rows that need a new block (one step in block_size). Returns the running requests with
        more than one token to compute, in order."""
        batch, running, bs = self.batch, self.running, self.block_size
        rs = np.fromiter(map(_slot, running), np.int64, len(running))
        computed = batch.computed[rs]
        generating = batch.compute_limit[rs] < 0
        known = batch.num_tokens[rs] + batch.pending[rs]
        remaining = np.where(generating, known, batch.compute_limit[rs]) - computed
        # a generating request whose last token is in flight finishes when that lands
        open_ = ~generating | (known < batch.length_limit[rs])
        if self.long_rope_after is not None:  # past N only on the long factors: it waits to be requeued
            open_ &= batch.long_rope[rs] | (computed < self.long_rope_after)
        pos = np.flatnonzero((remaining == 1) & open_)
        visited = len(running)
        budget = self.max_num_batched_tokens
        if len(pos) >= budget:
            pos = pos[:budget]
            visited = int(pos[-1]) + 1
        chunks = [running[i] for i in np.flatnonzero((remaining[:visited] > 1) & open_[:visited]).tolist()]
        grow = pos[computed[pos] >= batch.num_blocks[rs[pos]] * bs]  # rows whose blocks are full
        blocks = self.kv.pool.allocate(len(grow)) if len(grow) else None
        if blocks is not None:  # the usual case, one new block each, as vector operations
            for req, block in zip(map(running.__getitem__, grow.tolist()), blocks, strict=True):
                req.block_table.append(block)
            batch.append_blocks(rs[grow], blocks)
            grow = grow[:0]
        for p in grow.tolist():  # not enough free blocks: row by row, preempting the newest
            if p >= len(running):
                break  # preempted to make room for an older row
            req = running[p]
            if not self._grow_or_preempt(req, 1, out):
                running.pop()  # it is the newest and nothing is left to take from: it yields itself
                self._preempt(req, out)
                break
            batch.refresh(req)
        pos = pos[pos < len(running)]
        slots = rs[pos]
        batch.computed[slots] += 1
        batch.scheduled_in_step[slots] = out.step_index
        samples = generating[pos]
        batch.pending[slots[samples]] += 1
        starts = computed[pos]
        # every running row decodes (the steady state): they are the running list itself
        out.requests.extend(running if len(pos) == len(running) else map(running.__getitem__, pos.tolist()))
        out.starts.extend(starts.tolist())
        out.num_tokens.extend([1] * len(pos))
        out.samples.extend(samples.tolist())
        out.slots.extend(slots.tolist())
        # the same rows as arrays, kept for the step's readers while no other rows follow them
        out._arrays = {
            "slots": slots,
            "starts": starts,
            "num_tokens": np.ones(len(pos), np.int64),
            "samples": samples,
        }
        out.num_scheduled_tokens += len(pos)
        out.num_decode_tokens += int(np.count_nonzero(samples & (computed[pos] >= batch.num_prompt[slots])))
        return chunks

    def _schedule(self, req: Request, n: int, out: SchedulerOutput) -> int:
        start = req.num_computed_tokens
        sample = req.generates and start + n == req.num_target_tokens
        out.add(req, start, n, sample)
        out.slots.append(req.slot)
        req.num_computed_tokens = start + n
        self.kv.note_in_flight(req, start + n)  # the blocks it fills: later admissions may share them
        self.batch.scheduled_in_step[req.slot] = out.step_index
        if sample:
            req.num_pending_tokens += 1
        self.batch.refresh(req)  # blocks it was just given
        return n

    def _grow_or_preempt(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Make room for n more tokens of req, preempting the newest running requests not yet
        scheduled this step."""
        while self.kv.allocate_slots(req, n) is None:
            victim = self.running[-1]
            if victim is req or self.batch.scheduled_in_step[victim.slot] == out.step_index:
                return self._reclaim_from_waiting() and self.kv.allocate_slots(req, n) is not None
            self.running.pop()
            self._preempt(victim, out)
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self._requeue(req)
        req.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(req)

    def _requeue(self, req: Request) -> None:
        """req gives its blocks back and waits at the front of the queue to recompute."""
        if self.kv.caching:  # its generated blocks, so its recompute finds them (refresh_hashed)
            self.kv.cache_full_blocks(req)
        self.kv.free(req)
        req.status = RequestStatus.WAITING
        req.num_pending_tokens = 0  # a token in flight is dropped and sampled again on recompute
        scoring.forget_results(req)
        self.batch.remove(req)
        self.waiting.appendleft(req)
        self._released_ids.append(req.request_id)

    def _requeue_outgrowing_short_rope(self) -> None:
        """Generating requests on the short factors whose next position is N (they hold N + 1
        tokens) recompute everything on the long ones, as transformers' Phi-3 drops its cache
        there; one whose token at N is still in flight waits a step for it (_schedule_decodes)."""
        batch, n = self.batch, self.long_rope_after
        rs = np.fromiter(map(_slot, self.running), np.int64, len(self.running))
        due = ~batch.long_rope[rs] & (batch.computed[rs] >= n) & (batch.compute_limit[rs] < 0)
        due &= (batch.pending[rs] == 0) & (batch.num_tokens[rs] < batch.length_limit[rs])
        for i in np.flatnonzero(due)[::-1].tolist():  # requeued last first: they wait in running order
            self._requeue(self.running.pop(i))

    def _reclaim_from_waiting(self) -> bool:
        """Free blocks held by waiting requests (forked scoring children): the last resort when
        the requests that must progress cannot otherwise get blocks. True if any were freed."""
        freed = False
        for req in self.waiting:
            if req.block_table:
                self.kv.free(req)
                freed = True
        return freed

    # ---- admission ------------------------------------------------------------------------------

    def _admit(self, budget: int, out: SchedulerOutput) -> None:
        bs = self.block_size
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if self.long_rope_after is not None and not req.long_rope and req.generates:
                self._choose_rope(req)
            hits = self.kv.get_computed_blocks(req)  # stop short of a row whose logits are needed
            source, copied = self.kv.partial_hit(req, hits)  # and the next block's shared tokens
            hit_tokens = len(hits) * bs + copied
            n = min(req.num_remaining_tokens - hit_tokens, budget)
            if self.kv.allocate_slots(req, n, hits, copied) is None:
                # Waiting scoring children may hold shared blocks; with nothing running they
                # are all that stands in the way, and the head always fits the cache alone.
                if self.running or not self._reclaim_from_waiting():
                    return
                continue
            self.waiting.popleft()
            if copied:
                out.kv_copies.append(
                    (source, req.block_table[(req.num_computed_tokens - copied) // bs], copied)
                )
            if hit_tokens:
                if not req.admitted:
                    req.num_cached_tokens = hit_tokens
                out.num_prefix_hit_tokens += hit_tokens
                self.num_prefix_hit_tokens += hit_tokens
            req.admitted = True
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self.batch.add(req)
            budget -= self._schedule(req, n, out)

    def _choose_rope(self, req: Request) -> None:
        """A generating request holding more than N tokens computes on the long factors; the hashes
        of its blocks (short ones, if it ran before) start again on the long chain."""
        if req.num_tokens > self.long_rope_after:
            req.long_rope = True
            req.block_hashes = []

    def _fork(self, parent: Request) -> None:
        """The parent's full blocks now hold the prompt prefix: hand them to the children (by
        reference count, independent of the prefix cache) and queue the children first. The
        partial last block is the parent's alone and is freed; each child gets a block of its own
        with that block's tokens copied into it by the next step, before anything can overwrite
        the freed one (steps write KV only after their copies)."""
        full, partial = divmod(parent.num_computed_tokens, self.block_size)
        children = parent.scoring.children
        for child in children:
            self.kv.share_prefix(parent, child, full)
            if partial:
                self.kv.copy_partial_block(parent, child, partial)
        self.kv.free(parent)
        self.batch.remove(parent)
        parent.status = RequestStatus.FORKED
        parent.scoring.num_live_children = len(children)
        self.waiting.extendleft(reversed(children))

    # ---- results --------------------------------------------------------------------------------

    def update(self, out: SchedulerOutput, result: RunnerOutput) -> list[Request]:
        """Apply the runner's results of the step `out`; return the requests that finished, in
        completion order (scoring requests appear once, as the parent)."""
        finished = [req for req, _ in out.failed]
        finished += self._finished_early
        self._finished_early = []
        if not out.requests:
            return finished
        batch, requests = self.batch, out.requests
        slots = out.array("slots")
        # a row whose request was preempted or finished since the step was scheduled is void
        valid = batch.epoch[slots] == out.epochs
        sampled = out.array("samples")
        scored = valid & ~sampled & (batch.compute_limit[slots] >= 0)
        rows = np.flatnonzero(sampled)  # the runner's sample rows, in order
        tokens = _sampled_tokens(result, requests, rows)
        keep = valid[rows]
        rows, tokens = rows[keep], tokens[keep]
        events = self._append_tokens(out, rows, tokens, result)
        ends = out.array("starts") + out.array("num_tokens")
        for i in np.flatnonzero(valid & (ends >= batch.next_hash_end[slots])).tolist():
            req = requests[i]  # a block of it is full: offer it to the prefix cache
            self.kv.cache_full_blocks(req, int(ends[i]))
            batch.refresh_hashed(req)
        events += [(i, None) for i in np.flatnonzero(scored).tolist()]
        events.sort(key=_first)
        for i, reason in events:  # the rare events, in row order
            req = requests[i]
            if reason is None:
                self._apply_scoring(req, int(ends[i]), result, finished)
            else:
                self._finish(req, reason)
                finished.append(req)
        if events:
            running = RequestStatus.RUNNING
            self.running = [r for r in self.running if r.status is running]
        return finished

    def _append_tokens(
        self, out: SchedulerOutput, rows: np.ndarray, tokens: np.ndarray, result: RunnerOutput
    ):
        """Append each valid sample row's token to its request (in its batch slot: no Python per
        row); (row, "stop" | "length") for the rows that it finishes."""
        batch, requests = self.batch, out.requests
        slots = out.array("slots")[rows]
        batch.pending[slots] -= 1
        batch.append_tokens(slots, tokens)
        if result.sampled_logprobs:
            for i in rows.tolist():
                req = requests[i]
                if req.params.logprobs:
                    req.output_logprobs.append(result.sampled_logprobs[req.request_id])
        stop_ids = self._stop_id_array  # a few ids: one comparison each beats np.isin's sort
        stop = (tokens[:, None] == stop_ids).any(axis=1) if len(stop_ids) <= 8 else np.isin(tokens, stop_ids)
        for j in np.flatnonzero(stop).tolist():
            stop[j] = int(tokens[j]) in requests[rows[j]].stop_token_set
        done = stop | (batch.num_tokens[slots] >= batch.length_limit[slots])
        return [(int(rows[j]), "stop" if stop[j] else "length") for j in np.flatnonzero(done).tolist()]

    def _apply_scoring(self, req: Request, end: int, result: RunnerOutput, finished: list[Request]) -> None:
        if req.kind is RequestKind.POOL:
            if end >= req.compute_limit:
                req.embedding = result.pooled[req.request_id]
                self._finish(req, "pooled")
                finished.append(req)
            return
        event = scoring.apply_results(req, end, result)
        if event is ScoringEvent.FORK:
            self._fork(req)
        elif event is ScoringEvent.PARENT_DONE:
            self._finish(req, "scored")
            finished.append(req)
        elif event is ScoringEvent.CHILD_DONE:
            self._finish(req, "scored")
            if scoring.child_finished(req):
                parent = req.scoring.parent
                self._finish(parent, "scored")
                finished.append(parent)

    def fail_stalled(self) -> list[Request]:
        """Last-resort guard against a hang: if a step could schedule nothing although work is
        left, fail the request at the head of the line (with its scoring family)."""
        req = self.waiting[0] if self.waiting else self.running[-1]
        target = scoring.parent_of(req) or req
        why = "the scheduler could not make progress with this request (internal error)"
        for member in (*scoring.children_of(target), target):
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
        self.kv.free(req)
        self.batch.remove(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.error = error
        req.num_pending_tokens = 0
        self._live_ids.discard(req.request_id)
        for child in scoring.children_of(req):
            self._live_ids.discard(child.request_id)
        self._released_ids.append(req.request_id)


_slot = attrgetter("slot")


def _first(pair):
    return pair[0]


def _sampled_tokens(result: RunnerOutput, requests: list[Request], rows: np.ndarray) -> np.ndarray:
    """The tokens of the step's sample rows (`rows` of `requests`), in row order."""
    if result.sampled_tokens is not None:
        return np.asarray(result.sampled_tokens, dtype=np.int64)
    sampled = result.sampled
    return np.array([sampled[requests[i].request_id] for i in rows.tolist()], dtype=np.int64)
