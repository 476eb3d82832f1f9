"""Per-request state of the running requests in numpy arrays, one row ("slot") per request. No torch.

The steady decode step touches every running request: advance its computed tokens, append the
token it sampled, check its stop and length limits, find its next input and KV slot. Held here as
arrays, that is a handful of vector operations per step instead of a Python loop over requests
(vLLM v1's InputBatch). A request's Python object stays the owner of its token list and block
list; the counters that change every step (computed and pending tokens) and its newest tokens (up to
UNSYNCED_TOKENS of them) live in its slot while it runs (Request reads them from here), and the
rest is a mirror refreshed at the rare events: a new block, admission, finish, preemption, a block
offered to the prefix cache.
"""

from __future__ import annotations

import numpy as np

from bulkrun.engine.core.request import Request

_NEVER = np.iinfo(np.int64).max
UNSYNCED_TOKENS = 32  # a slot's newest tokens kept here before they join the request's list


class RunningBatch:
    def __init__(self, block_size: int, caching: bool, max_rows: int, max_blocks: int = 16):
        """max_rows: the most requests that run at once (the scheduler's max_num_seqs)."""
        self.block_size = block_size
        self.caching = caching
        n = max_rows
        self.computed = np.zeros(n, np.int64)  # num_computed_tokens
        self.pending = np.zeros(n, np.int64)  # num_pending_tokens
        self.num_tokens = np.zeros(n, np.int64)  # len(token_ids): the tokens that have landed
        self.last_token = np.zeros(n, np.int64)  # token_ids[-1]
        self.num_prompt = np.zeros(n, np.int64)
        self.compute_limit = np.full(n, -1, np.int64)  # -1: generates
        self.length_limit = np.full(n, _NEVER, np.int64)
        self.long_rope = np.zeros(n, bool)  # Request.long_rope (set while it waits, never while it runs)
        self.next_hash_end = np.full(n, _NEVER, np.int64)  # end of the next block to offer the cache
        self.scheduled_in_step = np.full(n, -1, np.int64)
        self.epoch = np.zeros(n, np.int64)  # bumped when a slot changes owner: stale results are void
        self.num_blocks = np.zeros(n, np.int64)  # len(block_table) copied into `tables`
        self.tables = np.zeros((n, max_blocks), np.int32)
        self.new_tokens = np.zeros((n, UNSYNCED_TOKENS), np.int64)  # landed, not yet in the list
        self.unsynced = np.zeros(n, np.int64)
        self.owner: list[Request | None] = [None] * n
        # running requests that do not take the plain argmax (sampled, or asking for logprobs):
        # none, and the runner skips looking at every row's parameters
        self.num_not_plain_greedy = 0
        self.free_slots = list(range(n - 1, -1, -1))

    # ---- slots ----------------------------------------------------------------------------------

    def add(self, req: Request) -> None:
        """Give a request that starts running a slot, its counters moving into the arrays."""
        slot = self.free_slots.pop()
        computed, pending = req.num_computed_tokens, req.num_pending_tokens
        req.slot, req.batch = slot, self
        self.owner[slot] = req
        self.unsynced[slot] = 0
        self.num_not_plain_greedy += not req.params.plain_greedy
        self.computed[slot], self.pending[slot] = computed, pending
        self.num_prompt[slot] = req.num_prompt_tokens
        self.compute_limit[slot] = -1 if req.compute_limit is None else req.compute_limit
        self.length_limit[slot] = req.length_limit if req.generates else _NEVER
        self.long_rope[slot] = req.long_rope
        self.num_blocks[slot] = 0
        self.refresh(req)

    def remove(self, req: Request) -> None:
        """The request stops running: its counters move back onto it, its slot is free."""
        slot = req.slot
        if slot < 0:
            return
        if self.unsynced[slot]:
            self.sync_tokens(req)
        computed, pending = int(self.computed[slot]), int(self.pending[slot])
        req.slot, req.batch = -1, None
        self.owner[slot] = None
        self.num_not_plain_greedy -= not req.params.plain_greedy
        req.num_computed_tokens, req.num_pending_tokens = computed, pending
        self.epoch[slot] += 1
        self.scheduled_in_step[slot] = -1
        self.free_slots.append(slot)

    def append_tokens(self, slots: np.ndarray, tokens: np.ndarray) -> None:
        """One landed token for each of `slots` (distinct): kept in the slots, moved into the
        requests' lists when a slot's buffer is full (every UNSYNCED_TOKENS steps)."""
        at = self.unsynced[slots]
        self.new_tokens[slots, at] = tokens
        self.unsynced[slots] = at + 1
        self.num_tokens[slots] += 1
        self.last_token[slots] = tokens
        for slot in slots[at + 1 == UNSYNCED_TOKENS].tolist():
            self.sync_tokens(self.owner[slot])

    def append_blocks(self, slots: np.ndarray, blocks: list[int]) -> None:
        """One new block at the end of each of `slots`' tables (distinct slots), as the requests'
        block lists got them."""
        at = self.num_blocks[slots]
        if int(at.max()) >= self.tables.shape[1]:
            self._widen(int(at.max()) + 1)
        self.tables[slots, at] = blocks
        self.num_blocks[slots] = at + 1

    def _widen(self, width: int) -> None:
        wider = np.zeros((self.tables.shape[0], max(width, 2 * self.tables.shape[1])), np.int32)
        wider[:, : self.tables.shape[1]] = self.tables
        self.tables = wider

    def sync_tokens(self, req: Request) -> None:
        """Move the slot's waiting tokens into req's token list."""
        slot = req.slot
        count = int(self.unsynced[slot])
        req._token_list.extend(self.new_tokens[slot, :count].tolist())
        self.unsynced[slot] = 0

    def refresh(self, req: Request) -> None:
        """Mirror what changed on the request outside the steady path (its tokens, new blocks,
        blocks offered to the prefix cache)."""
        slot = req.slot
        ids, table = req.token_ids, req.block_table
        self.num_tokens[slot] = len(ids)
        self.last_token[slot] = ids[-1]
        have = int(self.num_blocks[slot])
        if len(table) < have:
            have = 0
        if len(table) > self.tables.shape[1]:
            self._widen(len(table))
        if len(table) > have:
            self.tables[slot, have : len(table)] = table[have:]
        self.num_blocks[slot] = len(table)
        self.refresh_hashed(req)

    def refresh_hashed(self, req: Request) -> None:
        """Where the request's next block to offer the prefix cache ends. A generating request's
        blocks past its prompt are offered only if it is preempted (scheduler._preempt): a batch
        job reads generated tokens again only to recompute a preempted request, and hashing them
        as they fill cost the steady decode step a Python call for every 16th row."""
        if self.caching:
            end = (req.num_hashed_blocks + 1) * self.block_size
            self.next_hash_end[req.slot] = _NEVER if req.generates and end > req.num_prompt_tokens else end
