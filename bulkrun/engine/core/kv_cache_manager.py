"""Which KV-cache blocks each request holds: prefix-cache lookups, growth, release. No torch.

The scheduler decides who runs (policy); this module is the mechanism it calls: find the cached
blocks that extend a request's computed prefix (and a cached block sharing the leading tokens of
the next one, whose keys and values the step copies), give a request room for more tokens (all or
nothing), publish its full blocks to the prefix cache, and take its blocks back.
"""

from __future__ import annotations

from collections.abc import Sequence

from bulkrun.engine.core.block_pool import LONG_ROPE_ROOT, BlockPool, extend_block_hashes
from bulkrun.engine.core.request import Request


def _root(req: Request) -> int | None:
    """The parent hash of req's first block: a request on LongRoPE's long factors hashes on a chain
    of its own, so its blocks and a short-factor request's never stand in for each other."""
    return LONG_ROPE_ROOT if req.long_rope else None


def _hash_blocks(req: Request, num_blocks: int, block_size: int) -> None:
    """Extend req's block hashes to num_blocks."""
    extend_block_hashes(req.block_hashes, req.token_ids, num_blocks, block_size, _root(req))


class KVCacheManager:
    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.block_size = pool.block_size
        self.caching = pool.enable_prefix_caching
        # hash -> block: full blocks of known tokens that the step being scheduled fills (note_in_flight).
        # A later row of the same step may take them as computed: every row's KV is written before
        # any row's attention reads the cache, layer by layer, so its attention finds them. Cleared
        # in place by the scheduler at each step.
        self.in_flight: dict[int, int] = {}
        # (source block, destination block, tokens) decided between steps (copy_partial_block), for
        # the next step to run before its KV writes
        self.pending_copies: list[tuple[int, int, int]] = []

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def get_computed_blocks(self, req: Request) -> list[int]:
        """Cached blocks that extend req's computed prefix (references unchanged). Capped so that
        every token whose logits are needed (the last one when generating, the scored ones) is
        recomputed."""
        if not self.caching or not self._computed_to_table_end(req):
            return []
        start, stop = len(req.block_table), req.num_tokens_without_logits // self.block_size
        if stop <= start:
            return []
        _hash_blocks(req, stop, self.block_size)
        return self.pool.lookup_prefix(req.block_hashes[start:stop], self.in_flight)

    def note_in_flight(self, req: Request, end: int) -> None:
        """req's rows in this step compute its tokens up to `end`: offer the full blocks of known
        tokens among them, not yet in the prefix cache, to the requests admitted after it."""
        if not self.caching:
            return
        full = min(end, len(req.token_ids)) // self.block_size
        if full <= req.num_hashed_blocks:
            return
        _hash_blocks(req, full, self.block_size)
        for i in range(req.num_hashed_blocks, full):
            self.in_flight.setdefault(req.block_hashes[i], req.block_table[i])

    def partial_hit(self, req: Request, hits: Sequence[int]) -> tuple[int, int]:
        """(block, n) after the full `hits`: a cached block whose first n tokens are req's next n,
        for the step to copy (allocate_slots(..., copied=n)); (-1, 0) when there is none. Capped as
        get_computed_blocks is; only where req's computed tokens end on a block boundary."""
        if not self.caching or not self._computed_to_table_end(req):
            return -1, 0
        table, bs = len(req.block_table) + len(hits), self.block_size
        start = table * bs
        limit = min(bs - 1, req.num_tokens_without_logits - start)
        if limit <= 0:
            return -1, 0
        _hash_blocks(req, table, bs)
        parent = req.block_hashes[table - 1] if table else _root(req)
        block, n = self.pool.partial_match(parent, req.token_ids[start : start + limit])
        return (block, n) if n else (-1, 0)

    def num_blocks_needed(
        self, req: Request, num_new_tokens: int, hits: Sequence[int] = (), copied: int = 0
    ) -> int:
        """Fresh blocks allocate_slots(req, num_new_tokens, hits, copied) would take."""
        covered = req.num_computed_tokens + len(hits) * self.block_size + copied + num_new_tokens
        return -(-covered // self.block_size) - len(req.block_table) - len(hits)

    def allocate_slots(
        self, req: Request, num_new_tokens: int, hits: Sequence[int] = (), copied: int = 0
    ) -> list[int] | None:
        """Take the cached `hits` (from get_computed_blocks; they become computed tokens) and make
        req's block table cover num_new_tokens more. `copied`: tokens after the hits that the step
        copies into req's first new block (partial_hit) and that count as computed. Returns the
        new blocks, or None (and changes nothing) when the pool cannot supply them."""
        need = self.num_blocks_needed(req, num_new_tokens, hits, copied)
        if need > 0 and need > self.pool.num_free_after_sharing(hits):
            return None
        if hits:
            self.pool.share(hits)
            req.block_table.extend(hits)
            req.num_computed_tokens += len(hits) * self.block_size
            req.num_hashed_blocks = len(req.block_table)
        req.num_computed_tokens += copied
        if need <= 0:
            return []
        blocks = self.pool.allocate(need)
        req.block_table.extend(blocks)
        return blocks

    def room_for(self, req: Request) -> int:
        """How many more tokens req could compute if it took every free block."""
        return (len(req.block_table) + self.pool.num_free_blocks) * self.block_size - req.num_computed_tokens

    def cache_full_blocks(self, req: Request, num_computed: int | None = None) -> None:
        """Publish to the prefix cache req's full blocks among its first num_computed tokens
        (default: all computed) whose token ids are known."""
        if num_computed is None:
            num_computed = req.num_computed_tokens
        full = min(num_computed, len(req.token_ids)) // self.block_size
        if full <= req.num_hashed_blocks or full > len(req.block_table):
            return
        _hash_blocks(req, full, self.block_size)
        table, hashes, cache, bs = req.block_table, req.block_hashes, self.pool.cache_block, self.block_size
        for i in range(req.num_hashed_blocks, full):
            cache(
                table[i], hashes[i], hashes[i - 1] if i else _root(req), req.token_ids[i * bs : (i + 1) * bs]
            )
        req.num_hashed_blocks = full

    def copy_partial_block(self, source: Request, target: Request, num_tokens: int) -> None:
        """target holds source's first blocks up to the block in which source's computed tokens end:
        give it a block of its own holding that block's first num_tokens (at most what target
        may take without logits), copied by the next step. Nothing when no block is free: target
        then computes them."""
        if not self._computed_to_table_end(target):
            return
        start = len(target.block_table) * self.block_size
        n = min(num_tokens, target.num_tokens_without_logits - start)
        if n <= 0:
            return
        blocks = self.pool.allocate(1)
        if blocks is None:
            return
        self.pending_copies.append((source.block_table[len(target.block_table)], blocks[0], n))
        target.block_table.extend(blocks)
        target.num_computed_tokens += n

    def _computed_to_table_end(self, req: Request) -> bool:
        """Whether req's computed tokens fill its blocks: only then can hits or a copy follow them
        (a block partly computed, as a forked child's copied one, ends its prefix)."""
        return req.num_computed_tokens == len(req.block_table) * self.block_size

    def share_prefix(self, source: Request, target: Request, num_blocks: int) -> None:
        """Give target (holding nothing) source's first num_blocks blocks as its computed prefix."""
        shared = source.block_table[:num_blocks]
        self.pool.share(shared)
        target.block_table = list(shared)
        target.num_computed_tokens = num_blocks * self.block_size
        target.num_hashed_blocks = num_blocks

    def free(self, req: Request) -> None:
        """Take back req's blocks (tail first: evicted before shared prefixes); it computed nothing."""
        if req.block_table:
            self.pool.free(reversed(req.block_table))
        req.block_table = []
        req.num_computed_tokens = 0
        req.num_hashed_blocks = 0
