"""BlockPool: allocation, reference counts, chained hashes, prefix reuse, partial matches, LRU eviction."""

from __future__ import annotations

from bulkrun.engine.core.block_pool import RECENT_CHILDREN, BlockPool, extend_block_hashes, hash_block_tokens


def hashes_of(tokens: list[int], block_size: int = 4) -> list[int]:
    out: list[int] = []
    extend_block_hashes(out, tokens, len(tokens) // block_size, block_size)
    return out


def test_allocate_until_empty_then_none():
    pool = BlockPool(4, 2)
    a = pool.allocate(3)
    assert sorted(a) == [0, 1, 2] and pool.num_free_blocks == 1
    assert pool.allocate(2) is None  # never a partial allocation
    assert pool.num_free_blocks == 1
    assert pool.allocate(1) == [3]
    assert pool.allocate(1) is None
    assert pool.num_used_blocks == 4


def test_free_returns_blocks_and_rejects_double_free():
    pool = BlockPool(2, 2)
    blocks = pool.allocate(2)
    pool.free(blocks)
    assert pool.num_free_blocks == 2 and pool.ref_counts == [0, 0]
    try:
        pool.free([blocks[0]])
    except RuntimeError:
        pass
    else:
        raise AssertionError("double free went unnoticed")


def test_shared_block_is_free_only_after_last_reference():
    pool = BlockPool(2, 2)
    (b,) = pool.allocate(1)
    pool.share([b])
    assert pool.ref_counts[b] == 2
    pool.free([b])
    assert pool.num_free_blocks == 1  # still held once
    pool.free([b])
    assert pool.num_free_blocks == 2


def test_hashes_are_chained_with_the_parent():
    a = hashes_of([1, 2, 3, 4, 5, 6, 7, 8])
    b = hashes_of([9, 9, 9, 9, 5, 6, 7, 8])
    assert a[1] != b[1]  # same tokens in block 1, different prefix
    assert a[0] == hash_block_tokens(None, [1, 2, 3, 4])
    assert a[1] == hash_block_tokens(a[0], [5, 6, 7, 8])
    assert hashes_of([1, 2, 3, 4, 5, 6]) == a[:1]  # only full blocks are hashed


def test_extend_block_hashes_is_incremental():
    tokens = list(range(12))
    partial: list[int] = []
    extend_block_hashes(partial, tokens, 1, 4)
    extend_block_hashes(partial, tokens, 3, 4)
    assert partial == hashes_of(tokens)


def test_prefix_lookup_reuses_cached_blocks_in_order():
    pool = BlockPool(8, 4)
    h = hashes_of(list(range(12)))
    blocks = pool.allocate(3)
    for block, bh in zip(blocks, h, strict=True):
        pool.cache_block(block, bh)
    assert pool.lookup_prefix(h) == blocks
    other = hashes_of([0, 1, 2, 3, 9, 9, 9, 9])
    assert pool.lookup_prefix(other) == blocks[:1]  # stops at the first miss
    # block 1's tokens at the start of a sequence are a different block
    assert pool.lookup_prefix([hash_block_tokens(None, [4, 5, 6, 7])]) == []
    pool.share(blocks[:2])
    assert pool.ref_counts[blocks[0]] == 2


def test_freed_cached_block_survives_and_is_revived():
    pool = BlockPool(2, 4)
    h = hashes_of([1, 2, 3, 4])
    (b,) = pool.allocate(1)
    pool.cache_block(b, h[0])
    pool.free([b])
    assert pool.num_free_blocks == 2 and pool.num_cached_blocks == 1
    hits = pool.lookup_prefix(h)
    assert hits == [b]
    assert pool.num_free_after_sharing(hits) == 1  # reviving it takes it off the free count
    pool.share(hits)
    assert pool.ref_counts[b] == 1 and pool.num_free_blocks == 1


def test_uncached_blocks_are_reused_before_evicting_cached_ones():
    pool = BlockPool(3, 4)
    a, b, c = pool.allocate(3)
    pool.cache_block(a, 111)
    pool.free([a, b, c])  # a cached; b and c plain free
    assert sorted(pool.allocate(2)) == [b, c]
    assert pool.lookup_prefix([111]) == [a]  # still cached
    assert pool.allocate(1) == [a]  # now evicted
    assert pool.lookup_prefix([111]) == []
    assert pool.block_hash(a) is None and pool.num_evictions == 1


def test_eviction_is_least_recently_freed_first():
    pool = BlockPool(3, 4)
    a, b, c = pool.allocate(3)
    for block, bh in ((a, 1), (b, 2), (c, 3)):
        pool.cache_block(block, bh)
    pool.free([b])
    pool.free([c])
    pool.free([a])  # LRU order now b, c, a
    assert pool.allocate(1) == [b]
    pool.share(pool.lookup_prefix([3]))  # touching c takes it out of the LRU list
    assert pool.allocate(1) == [a]
    assert pool.allocate(1) is None


def test_first_writer_of_a_hash_wins():
    pool = BlockPool(2, 4)
    a, b = pool.allocate(2)
    pool.cache_block(a, 42)
    pool.cache_block(b, 42)  # same content computed twice: b stays private
    assert pool.block_hash(b) is None
    pool.free([a, b])
    assert pool.lookup_prefix([42]) == [a]


def test_caching_off_never_hits_nor_hashes():
    pool = BlockPool(2, 4, enable_prefix_caching=False)
    (a,) = pool.allocate(1)
    pool.cache_block(a, 7)
    assert pool.block_hash(a) is None
    pool.free([a])
    assert pool.lookup_prefix([7]) == []
    assert pool.num_cached_blocks == 0


def test_used_blocks_are_handed_out_before_never_touched_ones():
    pool = BlockPool(8, 4)
    a, b, c = pool.allocate(3)
    assert pool.num_touched_blocks == 3
    pool.cache_block(a, 5)
    pool.free([c, b, a])  # b and c plain free (c first), a cached and evictable
    assert pool.allocate(1) == [b]  # last freed plain block first
    assert pool.allocate(1) == [c]
    assert pool.allocate(1) == [a]  # then the evictable cached block, before new memory
    assert pool.num_evictions == 1 and pool.num_touched_blocks == 3
    assert pool.allocate(2) == [3, 4]  # only now blocks never touched
    assert pool.num_touched_blocks == 5 and pool.num_free_blocks == 3


def test_a_steady_workload_touches_only_what_it_holds_at_once():
    pool = BlockPool(1000, 4)
    for _ in range(50):  # 50 requests one after the other, 6 blocks each
        blocks = pool.allocate(6)
        pool.free(reversed(blocks))
    assert pool.num_touched_blocks == 6


def test_evicted_blocks_are_handed_out_in_address_order():
    """A finished sequence is freed tail first, so its cached blocks are evicted last-block first;
    the next sequence still gets them ascending (the CPU attention reads its keys as streams)."""
    pool = BlockPool(8, 4)
    blocks = pool.allocate(6)
    hashes = hashes_of(list(range(24)))
    for block, h in zip(blocks, hashes, strict=True):
        pool.cache_block(block, h)
    pool.free(reversed(blocks))
    assert pool.allocate(8) == list(range(8))  # six evicted (tail first) and two never touched


def test_freed_blocks_are_handed_out_in_address_order():
    pool = BlockPool(6, 4, enable_prefix_caching=False)
    blocks = pool.allocate(6)
    pool.free([blocks[5], blocks[1], blocks[3], blocks[0]])
    assert pool.allocate(3) == sorted([blocks[1], blocks[3], blocks[0]])  # the three freed last


def test_partial_match_finds_the_recent_child_sharing_most_leading_tokens():
    pool = BlockPool(8, 4)
    a, b, c = pool.allocate(3)
    root, (h,) = None, hashes_of([1, 2, 3, 4])
    pool.cache_block(a, h, root, [1, 2, 3, 4])
    pool.cache_block(b, 100, h, [5, 6, 7, 8])  # children of a
    pool.cache_block(c, 101, h, [5, 6, 9, 9])
    assert pool.partial_match(root, [1, 2, 7]) == (a, 2)
    assert pool.partial_match(h, [5, 6, 9, 1]) == (c, 3)
    assert pool.partial_match(h, [5, 6, 7, 1]) == (b, 3)
    assert pool.partial_match(h, [8, 8]) == (-1, 0)  # no leading token shared
    assert pool.partial_match(101, [5]) == (-1, 0)  # another parent: nothing
    pool.free([a, b, c])
    assert pool.allocate(3) == [a, b, c]  # evicted: they stand in for nothing any more
    assert pool.partial_match(h, [5, 6]) == (-1, 0) and pool.partial_match(root, [1]) == (-1, 0)


def test_partial_match_keeps_the_last_few_children_of_a_parent():
    pool = BlockPool(16, 4)
    blocks = pool.allocate(RECENT_CHILDREN + 1)
    for i, block in enumerate(blocks):
        pool.cache_block(block, 500 + i, 7, [i, 1, 1, 1])
    assert pool.partial_match(7, [0, 1]) == (-1, 0)  # the oldest one left the index
    assert pool.partial_match(7, [RECENT_CHILDREN, 1]) == (blocks[-1], 2)
    assert pool.lookup_prefix([500]) == [blocks[0]]  # still cached as a whole block
