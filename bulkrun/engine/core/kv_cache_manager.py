"""Which KV-cache blocks each request holds: prefix-cache lookups, growth, release. No torch.

The scheduler decides who runs (policy); this module is the mechanism it calls: find the cached
blocks that extend a request's computed prefix, give a request room for more tokens (all or
nothing), publish its full blocks to the prefix cache, and take its blocks back.
"""

from __future__ import annotations

from collections.abc import Sequence

from bulkrun.engine.core.block_pool import LONG_ROPE_ROOT, BlockPool, extend_block_hashes
from bulkrun.engine.core.request import Request


def _hash_blocks(req: Request, num_blocks: int, block_size: int) -> None:
    """Extend req's block hashes to num_blocks; a request on LongRoPE's long factors hashes on a
    chain of its own, so its blocks and a short-factor request's never stand in for each other."""
    root = LONG_ROPE_ROOT if req.long_rope else None
    extend_block_hashes(req.block_hashes, req.token_ids, num_blocks, block_size, root)


class KVCacheManager:
    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.block_size = pool.block_size
        self.caching = pool.enable_prefix_caching

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def get_computed_blocks(self, req: Request) -> list[int]:
        """Cached blocks that extend req's computed prefix (references unchanged). Capped so that
        every token whose logits are needed (the last one when generating, the scored ones) is
        recomputed."""
        if not self.caching:
            return []
        start, stop = len(req.block_table), req.num_tokens_without_logits // self.block_size
        if stop <= start:
            return []
        _hash_blocks(req, stop, self.block_size)
        return self.pool.lookup_prefix(req.block_hashes[start:stop])

    def num_blocks_needed(self, req: Request, num_new_tokens: int, hits: Sequence[int] = ()) -> int:
        """Fresh blocks allocate_slots(req, num_new_tokens, hits) would take."""
        covered = req.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        return -(-covered // self.block_size) - len(req.block_table) - len(hits)

    def allocate_slots(self, req: Request, num_new_tokens: int, hits: Sequence[int] = ()) -> list[int] | None:
        """Take the cached `hits` (from get_computed_blocks; they become computed tokens) and make
        req's block table cover num_new_tokens more. Returns the new blocks, or None (and changes
        nothing) when the pool cannot supply them."""
        need = self.num_blocks_needed(req, num_new_tokens, hits)
        if need > 0 and need > self.pool.num_free_after_sharing(hits):
            return None
        if hits:
            self.pool.share(hits)
            req.block_table.extend(hits)
            req.num_computed_tokens += len(hits) * self.block_size
            req.num_hashed_blocks = len(req.block_table)
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
        table, hashes, cache = req.block_table, req.block_hashes, self.pool.cache_block
        for i in range(req.num_hashed_blocks, full):
            cache(table[i], hashes[i])
        req.num_hashed_blocks = full

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
