"""Fixed pool of KV-cache blocks with reference counts and automatic prefix caching. No torch.

A full block is identified by a hash chained with its predecessor's hash, so equal hashes mean
equal token prefixes computed alike (a chain's root says how: LongRoPE's long factors give the same
tokens other keys). Freed blocks that carry a hash stay cached (evictable, least recently
freed first) until a free block is needed; blocks without a hash go back to the free list.

A cached block also stands in for the leading tokens it shares with a request's next block: the
last few blocks cached under each parent are kept with their tokens (`partial_match`), so a prompt
that leaves a shared prefix mid-block (a chat template's system turn, an instruction) takes the
shared tokens' keys and values by copy instead of computing them again.

Allocation prefers blocks already used once (plain freed ones, the most recently freed first, then
evictable cached ones, least recently used first) over blocks never touched, so the memory a run
actually touches (lazily mapped on the CPU) tracks its peak use rather than the cache's size.
One allocation's blocks come in address order (ascending runs read as streams).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

_ROOT_HASH = 0x5EED  # parent hash of a sequence's first block
RECENT_CHILDREN = 4  # cached blocks per parent whose tokens partial_match compares
# parent hash of the first block of a sequence whose KV is computed on LongRoPE's long factors
LONG_ROPE_ROOT = hash((_ROOT_HASH, "long_rope"))


def hash_block_tokens(parent_hash: int | None, tokens: Sequence[int]) -> int:
    return hash((_ROOT_HASH if parent_hash is None else parent_hash, tuple(tokens)))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):  # the shorter one bounds the match
        if x != y:
            break
        n += 1
    return n


def extend_block_hashes(
    hashes: list[int], token_ids: Sequence[int], num_blocks: int, block_size: int, root: int | None = None
) -> None:
    """Grow `hashes` (chained hashes of token_ids' full blocks) to `num_blocks` entries; `root`:
    the first block's parent (None: the plain root)."""
    for i in range(len(hashes), num_blocks):
        parent = hashes[i - 1] if i else root
        hashes.append(hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size]))


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one slot, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._free: list[int] = []  # freed, unreferenced, no hash; reused last-freed first
        self._num_touched = 0  # blocks _num_touched.. have never been handed out
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, hashed; LRU first
        self.num_evictions = 0
        # partial matches: parent hash -> its last RECENT_CHILDREN cached blocks (newest last), and
        # each such block's parent and tokens
        self._children: dict[int, list[int]] = {}
        self._parent_and_tokens: dict[int, tuple[int, tuple[int, ...]]] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: truly free plus evictable cached ones."""
        return len(self._free) + len(self._evictable) + self.num_blocks - self._num_touched

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def block_hash(self, block: int) -> int | None:
        return self._block_hash[block]

    def allocate(self, n: int) -> list[int] | None:
        """Take `n` blocks (reference count 1 each), or None when fewer than `n` can be had."""
        if n > self.num_free_blocks:
            return None
        free, ref_counts = self._free, self.ref_counts
        if n <= len(free):  # the common case: all from the freed stack
            blocks = free[len(free) - n :]
            del free[len(free) - n :]
        else:
            blocks = free[:]
            free.clear()
            while len(blocks) < n and self._evictable:
                blocks.append(self._evict_lru())
            fresh = n - len(blocks)
            blocks.extend(range(self._num_touched, self._num_touched + fresh))
            self._num_touched += fresh
        # in address order: sequences are freed (and evicted) tail first, and a sequence whose blocks
        # lie in ascending runs is read as streams (the CPU attention's keys and values)
        blocks.sort()
        for block in blocks:
            ref_counts[block] = 1
        return blocks

    @property
    def num_touched_blocks(self) -> int:
        """Blocks ever handed out: what the cache's memory holds at its peak so far."""
        return self._num_touched

    def _evict_lru(self) -> int:
        block, _ = self._evictable.popitem(last=False)
        del self._cached[self._block_hash[block]]
        self._block_hash[block] = None
        self._forget_tokens(block)
        self.num_evictions += 1
        return block

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block, in the given order (callers pass the tail first,
        so a sequence's last blocks, the least likely to be shared, are evicted first)."""
        for block in blocks:
            count = self.ref_counts[block] - 1
            if count < 0:
                raise RuntimeError(f"block {block} freed more often than allocated")
            self.ref_counts[block] = count
            if count == 0:
                if self._block_hash[block] is None:
                    self._free.append(block)
                else:
                    self._evictable[block] = None

    def share(self, blocks: Iterable[int]) -> None:
        """Take one more reference on blocks that are in use or cached (revives evictable ones)."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                if block not in self._evictable:
                    raise RuntimeError(f"block {block} is free and holds no cached content")
                del self._evictable[block]
            self.ref_counts[block] += 1

    def lookup_prefix(
        self, block_hashes: Sequence[int], in_flight: dict[int, int] | None = None
    ) -> list[int]:
        """Cached blocks for the longest leading run of `block_hashes`, a run that may go on in
        `in_flight` (hash -> block: blocks the step being scheduled fills); references unchanged."""
        if not self.enable_prefix_caching:
            return []
        hits = []
        for h in block_hashes:
            block = self._cached.get(h)
            if block is None and in_flight:
                block = in_flight.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_free_after_sharing(self, blocks: Sequence[int]) -> int:
        """Free blocks left for allocation once `blocks` (from lookup_prefix) are shared."""
        return self.num_free_blocks - sum(1 for b in blocks if self.ref_counts[b] == 0)

    def cache_block(
        self, block: int, block_hash: int, parent_hash: int | None = None, tokens: Sequence[int] = ()
    ) -> None:
        """Publish a full, computed block under its chained hash (first writer wins); with its
        parent's hash (None: the root) and tokens, it also serves partial matches."""
        if not self.enable_prefix_caching or self._block_hash[block] is not None:
            return
        if block_hash in self._cached:
            return  # same content computed twice at once: keep the first, this one stays private
        self._block_hash[block] = block_hash
        self._cached[block_hash] = block
        if tokens:
            parent = _ROOT_HASH if parent_hash is None else parent_hash
            children = self._children.setdefault(parent, [])
            if len(children) == RECENT_CHILDREN:
                del self._parent_and_tokens[children.pop(0)]
            children.append(block)
            self._parent_and_tokens[block] = (parent, tuple(tokens))

    def partial_match(self, parent_hash: int | None, tokens: Sequence[int]) -> tuple[int, int]:
        """(block, n): a cached block under `parent_hash` (None: the root) whose first n tokens are
        tokens[:n], n as large as the recent children give; (-1, 0) when none shares a token."""
        best, best_n = -1, 0
        for block in self._children.get(_ROOT_HASH if parent_hash is None else parent_hash, ()):
            n = _common_prefix(self._parent_and_tokens[block][1], tokens)
            if n > best_n:
                best, best_n = block, n
        return best, best_n

    def _forget_tokens(self, block: int) -> None:
        entry = self._parent_and_tokens.pop(block, None)
        if entry is not None:
            children = self._children[entry[0]]
            children.remove(block)
            if not children:
                del self._children[entry[0]]
