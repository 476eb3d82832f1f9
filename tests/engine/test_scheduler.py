"""Scheduler: chunked prefill, budget split, admission, preemption, prefix reuse, scoring forks.

Every test drives the scheduler with the fake runner, which checks the KV cache use of every step
(see engine_fakes.py), and compares the tokens with a one-request-at-a-time reference.
"""

from __future__ import annotations

import random

import pytest
from engine_fakes import (
    RunnerOutput,
    reference_generation,
    reference_scores,
    run_to_completion,
    score_logprob,
)

from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.core.request import RequestStatus


def gen(rid, prompt, max_tokens=4, **params):
    return EngineRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens, **params))


def step(sched, runner):
    out = sched.schedule()
    finished = sched.update(out, runner.execute(out) if len(out) else RunnerOutput())
    return out, finished


def chunks(out):
    return [(r.request_id, n, sample) for r, _, n, sample in out.rows()]


def test_long_prompt_is_chunked_at_block_edges(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=4)
    req = sched.add_request(gen("a", range(1, 11), max_tokens=3))
    assert chunks(step(sched, runner)[0]) == [("a", 4, False)]
    assert req.num_computed_tokens == 4 and len(req.block_table) == 1
    assert chunks(step(sched, runner)[0]) == [("a", 4, False)]
    assert chunks(step(sched, runner)[0]) == [("a", 2, True)]
    assert len(req.block_table) == 3 and req.output_token_ids == [11]
    finished = run_to_completion(sched, runner)
    assert finished == [req] and req.finish_reason == "length"
    assert req.output_token_ids == reference_generation(list(range(1, 11)), 3)


def test_chunks_off_block_edges_grow_the_table_just_in_time(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=3)
    req = sched.add_request(gen("a", range(1, 11), max_tokens=2))
    tables = []
    for _ in range(4):
        step(sched, runner)
        tables.append((req.num_computed_tokens, len(req.block_table)))
    assert tables == [(3, 1), (6, 2), (9, 3), (10, 3)]
    assert [s[0][2:] for s in runner.steps] == [(3, False), (3, False), (3, False), (1, True)]
    run_to_completion(sched, runner)
    assert req.output_token_ids == reference_generation(list(range(1, 11)), 2)


def test_decodes_go_first_and_prompt_chunks_fill_the_rest(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=8)
    sched.add_request(gen("a", [1, 2, 3], max_tokens=10))
    sched.add_request(gen("b", [4, 5, 6], max_tokens=10))
    assert chunks(step(sched, runner)[0]) == [("a", 3, True), ("b", 3, True)]
    sched.add_request(gen("c", range(1, 21), max_tokens=2))
    out, _ = step(sched, runner)
    assert chunks(out) == [("a", 1, True), ("b", 1, True), ("c", 6, False)]
    assert out.num_scheduled_tokens == 8


def test_several_prompts_are_prefilled_partially_at_once(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=10)
    prompts = {rid: list(range(10 * i + 1, 10 * i + 9)) for i, rid in enumerate("abc")}
    reqs = [sched.add_request(gen(rid, p, max_tokens=3)) for rid, p in prompts.items()]
    assert chunks(step(sched, runner)[0]) == [("a", 8, True), ("b", 2, False)]
    # a decodes first, then b's rest, then c's first chunk
    assert chunks(step(sched, runner)[0]) == [("a", 1, True), ("b", 6, True), ("c", 3, False)]
    assert [r.status for r in reqs] == [RequestStatus.RUNNING] * 3
    run_to_completion(sched, runner)
    for r in reqs:
        assert r.output_token_ids == reference_generation(prompts[r.request_id], 3)


def test_max_num_seqs_limits_admission(make_scheduler):
    sched, runner = make_scheduler(max_num_seqs=2, budget=64)
    for rid in "abc":
        sched.add_request(gen(rid, [1, 2], max_tokens=3))
    out, _ = step(sched, runner)
    assert [r.request_id for r in out.requests] == ["a", "b"]
    assert sched.num_waiting == 1
    finished = run_to_completion(sched, runner)
    assert [r.request_id for r in finished] == ["a", "b", "c"]


def test_finish_conditions(make_scheduler):
    sched, runner = make_scheduler(eos=(5,), max_model_len=12)
    eos = sched.add_request(gen("eos", [3], max_tokens=10))  # 4, 5=eos
    ignore = sched.add_request(gen("ign", [3], max_tokens=3, ignore_eos=True))
    stop_id = sched.add_request(gen("stop", [1], max_tokens=10, stop_token_ids=(3,)))
    ctx = sched.add_request(gen("ctx", [1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=10, ignore_eos=True))
    zero = sched.add_request(gen("zero", [1, 2], max_tokens=0))
    finished = run_to_completion(sched, runner)
    assert zero in finished and zero.output_token_ids == [] and zero.finish_reason == "length"
    assert (eos.output_token_ids, eos.finish_reason) == ([4, 5], "stop")
    assert (ignore.output_token_ids, ignore.finish_reason) == ([4, 5, 6], "length")
    assert (stop_id.output_token_ids, stop_id.finish_reason) == ([2, 3], "stop")
    assert len(ctx.token_ids) == 12 and ctx.finish_reason == "length"  # the model's context
    assert runner.pool.num_used_blocks == 0  # everyone's blocks came back


def test_requests_that_can_never_fit_fail_with_a_reason(make_scheduler):
    sched, runner = make_scheduler(num_blocks=4, block_size=4, max_model_len=32)
    too_long_for_cache = sched.add_request(gen("cache", range(1, 18)))
    too_long_for_model = sched.add_request(gen("ctx", range(1, 34)))
    fits = sched.add_request(gen("ok", range(1, 17), max_tokens=50))
    finished = run_to_completion(sched, runner)
    assert too_long_for_cache.finish_reason == "error"
    assert "5 KV-cache blocks" in too_long_for_cache.error and "has 4" in too_long_for_cache.error
    assert too_long_for_model.finish_reason == "error" and "context is 32" in too_long_for_model.error
    # a prompt that fills the whole cache still gets its one token, then stops for length
    assert fits.finish_reason == "length" and fits.output_token_ids == [17]
    assert finished[:2] == [too_long_for_cache, too_long_for_model]


def test_newest_running_request_is_preempted_and_recomputed(make_scheduler):
    # 6 blocks of 4: a and b fit at first, then their decodes run out of blocks.
    sched, runner = make_scheduler(num_blocks=6, block_size=4, budget=64)
    a = sched.add_request(gen("a", range(1, 10), max_tokens=10))
    b = sched.add_request(gen("b", range(20, 29), max_tokens=10))
    preempted = []
    for _ in range(200):
        if not sched.has_unfinished():
            break
        out, _ = step(sched, runner)
        preempted += [r.request_id for r in out.preempted]
    assert preempted and set(preempted) == {"b"}  # always the newer one
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert a.output_token_ids == reference_generation(list(range(1, 10)), 10)
    assert b.output_token_ids == reference_generation(list(range(20, 29)), 10)
    assert runner.pool.num_used_blocks == 0


def test_generated_blocks_reach_the_prefix_cache_only_when_preempted(make_scheduler):
    # b's 11 prompt tokens fill 2 blocks; it is preempted with a third full of generated tokens,
    # which survives as a's growth takes b's partial tail block (freed blocks: tail first)
    sched, runner = make_scheduler(num_blocks=7, block_size=4, budget=64)
    a = sched.add_request(gen("a", range(1, 10), max_tokens=10))
    b = sched.add_request(gen("b", range(20, 31), max_tokens=10))
    out = None
    while out is None or not out.preempted:
        for r in (a, b):  # while running, only blocks of prompt tokens are offered
            assert r.num_hashed_blocks * 4 <= r.num_prompt_tokens
        out, _ = step(sched, runner)
    assert out.preempted == [b] and b.num_output_tokens >= 4
    full = len(b.token_ids) // 4  # its generated tokens fill at least one more block
    assert full * 4 > b.num_prompt_tokens and len(b.block_hashes) == full
    assert len(runner.pool.lookup_prefix(b.block_hashes)) == full  # all offered as it was preempted
    run_to_completion(sched, runner)
    assert b.output_token_ids == reference_generation(list(range(20, 31)), 10)


def test_preempted_request_keeps_its_tokens_and_goes_first(make_scheduler):
    sched, runner = make_scheduler(num_blocks=5, block_size=4, budget=64, caching=False)
    sched.add_request(gen("a", range(1, 9), max_tokens=8))
    b = sched.add_request(gen("b", range(11, 19), max_tokens=8))
    sched.add_request(gen("c", [1, 2], max_tokens=1))
    while not b.num_preemptions:
        step(sched, runner)
    assert b.status is RequestStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert b.num_output_tokens > 0 and sched.waiting[0] is b
    run_to_completion(sched, runner)
    assert b.output_token_ids == reference_generation(list(range(11, 19)), 8)


def test_prefix_hit_skips_cached_blocks_but_recomputes_the_last_token(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=64)
    sched.add_request(gen("first", range(1, 9), max_tokens=1))
    run_to_completion(sched, runner)
    # longer first: it takes both cached blocks before same's new block could evict one of them
    # (allocation reuses evictable blocks before never-touched ones)
    longer = sched.add_request(gen("longer", list(range(1, 9)) + [30, 31], max_tokens=2))
    same = sched.add_request(gen("same", range(1, 9), max_tokens=2))
    out, _ = step(sched, runner)
    # the same 8-token prompt: block 0 is reused; block 1 holds the last token, recomputed in a
    # block of its own, after the three before it are copied from the cached block 1
    assert chunks(out) == [("longer", 2, True), ("same", 1, True)]
    assert same.num_cached_tokens == 7 and longer.num_cached_tokens == 8
    assert out.num_prefix_hit_tokens == 15 and sched.num_prefix_hit_tokens == 15
    assert out.kv_copies == [(longer.block_table[1], same.block_table[1], 3)]
    assert same.block_table[0] == longer.block_table[0]  # one cached block, two readers
    assert runner.pool.ref_counts[same.block_table[0]] == 2
    run_to_completion(sched, runner)
    assert same.output_token_ids == reference_generation(list(range(1, 9)), 2)
    assert longer.output_token_ids == reference_generation(list(range(1, 9)) + [30, 31], 2)


@pytest.mark.parametrize("reused_by", ["another request", "the copying request"])
def test_a_copied_source_block_may_be_reused_in_the_same_step(make_scheduler, reused_by):
    sched, runner = make_scheduler(num_blocks=4, block_size=4, budget=64)
    # blocks 0 and 1 cached and unreferenced; with 2 new tokens block 2 held the 9th and is plain free
    sched.add_request(gen("first", range(1, 9), max_tokens=2 if reused_by == "another request" else 1))
    run_to_completion(sched, runner)
    a = sched.add_request(gen("a", [1, 2, 3, 4, 5, 6, 30, 31], max_tokens=2))  # shares 5, 6 of block 1
    b = sched.add_request(gen("b", range(40, 48), max_tokens=2))  # takes what is left
    out, _ = step(sched, runner)
    ((source, destination, n),) = out.kv_copies
    assert n == 2 and a.num_cached_tokens == 6 and destination == a.block_table[1]
    if reused_by == "another request":  # evicted for b, which writes it in this step, after the copy
        assert source in b.block_table and destination != source
    else:  # evicted for a's own new block: the copy has nothing to move
        assert destination == source
    run_to_completion(sched, runner)  # the fake runner checks every token's KV
    assert a.output_token_ids == reference_generation([1, 2, 3, 4, 5, 6, 30, 31], 2)
    assert b.output_token_ids == reference_generation(list(range(40, 48)), 2)


def test_a_request_admitted_with_another_shares_the_blocks_that_step_fills(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=64)
    first = sched.add_request(gen("first", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], max_tokens=2))
    second = sched.add_request(gen("second", [1, 2, 3, 4, 5, 6, 7, 8, 30], max_tokens=2))
    out, _ = step(sched, runner)
    # first fills blocks 0 and 1 in this step; second takes them as computed and writes only its own
    # last token: every row's KV is written before any attention reads it
    assert chunks(out) == [("first", 10, True), ("second", 1, True)]
    assert second.block_table[:2] == first.block_table[:2] and second.num_cached_tokens == 8
    assert [runner.pool.ref_counts[b] for b in first.block_table[:2]] == [2, 2]
    run_to_completion(sched, runner)  # the fake runner checks every token's KV
    assert first.output_token_ids == reference_generation([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 2)
    assert second.output_token_ids == reference_generation([1, 2, 3, 4, 5, 6, 7, 8, 30], 2)


def test_blocks_in_flight_are_those_this_step_fills(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=8)
    first = sched.add_request(gen("first", list(range(1, 13)), max_tokens=2))
    second = sched.add_request(gen("second", list(range(1, 13)) + [40], max_tokens=2))
    out, _ = step(sched, runner)  # 8 of first's tokens: blocks 0 and 1 filled
    assert chunks(out) == [("first", 8, False)]
    assert sorted(sched.kv.in_flight.values()) == sorted(first.block_table[:2])
    out, _ = step(sched, runner)  # first fills block 2; second takes blocks 0-1 (cached) and 2 (in flight)
    assert chunks(out) == [("first", 4, True), ("second", 1, True)]
    assert list(sched.kv.in_flight.values())[:1] == [first.block_table[2]]
    assert second.block_table[:3] == first.block_table[:3] and second.num_cached_tokens == 12
    run_to_completion(sched, runner)
    assert first.output_token_ids == reference_generation(list(range(1, 13)), 2)
    assert second.output_token_ids == reference_generation(list(range(1, 13)) + [40], 2)


def test_prefix_cache_off_recomputes_everything(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=64, caching=False)
    sched.add_request(gen("first", range(1, 10), max_tokens=1))
    run_to_completion(sched, runner)
    again = sched.add_request(gen("again", range(1, 10), max_tokens=1))
    out, _ = step(sched, runner)
    assert chunks(out) == [("again", 9, True)] and again.num_cached_tokens == 0


def test_scoring_parent_computes_the_whole_prompt_and_forks_only_longer_continuations(make_scheduler):
    for caching in (True, False):
        sched, runner = make_scheduler(block_size=4, budget=64, caching=caching)
        prompt = list(range(1, 11))  # 10 tokens: blocks 0 and 1 are full, block 2 partial
        conts = [[40], [41, 42, 43], [44, 45]]
        parent = sched.add_request(EngineRequest("p", prompt, continuations=conts))
        out, finished = step(sched, runner)
        assert chunks(out) == [("p", 10, False)] and finished == []
        assert parent.scoring.first_token_logprobs == [score_logprob(prompt, c[0]) for c in conts]
        assert [c.request_id for c in parent.scoring.children] == ["p::cont1", "p::cont2"]
        assert parent.status is RequestStatus.FORKED
        out, finished = step(sched, runner)
        # each child gets the partial block's 2 tokens copied and computes its continuation but
        # the last, with or without the prefix cache
        assert chunks(out) == [("p::cont1", 2, False), ("p::cont2", 1, False)]
        assert [n for _, _, n in out.kv_copies] == [2, 2]
        assert finished == [parent] and parent.finish_reason == "scored"
        assert parent.continuation_logprobs() == [reference_scores(prompt, c) for c in conts]
        assert runner.pool.num_used_blocks == 0


def test_single_token_continuations_cost_a_prompt_and_fork_nothing(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=64)
    prompt = list(range(1, 11))
    conts = [[40], [41], [42]]
    parent = sched.add_request(EngineRequest("p", prompt, continuations=conts))
    out, finished = step(sched, runner)
    assert chunks(out) == [("p", 10, False)] and finished == [parent]
    assert parent.scoring.children == [] and parent.finish_reason == "scored"
    assert parent.continuation_logprobs() == [reference_scores(prompt, c) for c in conts]
    assert not sched.has_unfinished() and runner.pool.num_used_blocks == 0
    assert not sched._live_ids


def test_chunked_scoring_parent_scores_first_tokens_with_its_last_chunk(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=4)
    prompt = list(range(1, 11))
    parent = sched.add_request(EngineRequest("p", prompt, continuations=[[40], [41, 42]]))
    finished = run_to_completion(sched, runner)
    assert [s[0] for s in runner.steps] == [("p", 0, 4, False), ("p", 4, 4, False), ("p", 8, 2, False)] + [
        ("p::cont1", 10, 1, False)  # the partial block's 2 tokens copied, then 42 scored from 41's row
    ]
    assert finished == [parent]
    assert parent.continuation_logprobs() == [
        reference_scores(prompt, [40]),
        reference_scores(prompt, [41, 42]),
    ]


def test_scoring_fork_holds_shared_full_blocks_by_refcount(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=10, caching=False)
    prompt = list(range(1, 11))
    parent = sched.add_request(EngineRequest("p", prompt, continuations=[[40, 1], [41, 2], [42]]))
    step(sched, runner)  # parent computes the whole prompt, then forks two children
    a, b = parent.scoring.children
    assert a.block_table[:2] == b.block_table[:2] and len(a.block_table) == 3
    assert all(runner.pool.ref_counts[blk] == 2 for blk in a.block_table[:2])
    # the parent's partial block went back; each child holds a block of its own, its 2 tokens
    # copied by the next step
    assert a.block_table[2] != b.block_table[2] and runner.pool.num_used_blocks == 4
    assert a.num_computed_tokens == 10 and a.scoring.score_start == 11
    run_to_completion(sched, runner)
    assert parent.continuation_logprobs() == [reference_scores(prompt, c) for c in ([40, 1], [41, 2], [42])]


def test_block_aligned_scoring_prompt_children_compute_only_their_continuation(make_scheduler):
    sched, runner = make_scheduler(block_size=4)
    prompt = list(range(1, 9))  # exactly two blocks
    parent = sched.add_request(EngineRequest("p", prompt, continuations=[[7, 8, 9]]))
    step(sched, runner)
    out, finished = step(sched, runner)
    assert chunks(out) == [("p::cont0", 2, False)] and finished == [parent]
    assert parent.continuation_logprobs() == [reference_scores(prompt, [7, 8, 9])]


def test_a_child_forked_with_no_free_block_recomputes_the_partial_block(make_scheduler):
    sched, runner = make_scheduler(num_blocks=3, block_size=4, budget=16, caching=False)
    prompt = list(range(1, 11))  # 2 full blocks and a partial one: the pool's 3 blocks
    parent = sched.add_request(EngineRequest("p", prompt, continuations=[[40, 41], [42, 43]]))
    step(sched, runner)
    a, b = parent.scoring.children
    # the parent's partial block was still held while the children were given theirs: none left
    assert len(a.block_table) == 2 and a.num_computed_tokens == 8
    finished = run_to_completion(sched, runner)  # they recompute tokens 8 and 9 (the KV is checked)
    assert finished == [parent]
    assert parent.continuation_logprobs() == [reference_scores(prompt, c) for c in ([40, 41], [42, 43])]


def test_short_scoring_prompt_child_copies_the_prompt(make_scheduler):
    sched, runner = make_scheduler(block_size=4)
    parent = sched.add_request(EngineRequest("p", [1, 2, 3], continuations=[[7, 8]]))
    out, _ = step(sched, runner)
    assert chunks(out) == [("p", 3, False)]
    out, _ = step(sched, runner)  # the prompt's 3 tokens copied from the parent's only block
    assert chunks(out) == [("p::cont0", 1, False)] and [n for _, _, n in out.kv_copies] == [3]
    assert parent.continuation_logprobs() == [reference_scores([1, 2, 3], [7, 8])]


def test_cached_scoring_prompt_still_recomputes_its_last_token(make_scheduler):
    sched, runner = make_scheduler(block_size=4)
    prompt = list(range(1, 9))
    run_to_completion(sched, runner)
    sched.add_request(gen("warm", prompt, max_tokens=1))
    run_to_completion(sched, runner)
    parent = sched.add_request(EngineRequest("p", prompt, continuations=[[40], [41]]))
    out, finished = step(sched, runner)
    # block 0 cached, block 1's first three tokens copied: the last one is computed
    assert chunks(out) == [("p", 1, False)] and out.num_prefix_hit_tokens == 7
    assert finished == [parent]
    assert parent.continuation_logprobs() == [reference_scores(prompt, [40]), reference_scores(prompt, [41])]


def test_preempted_scoring_child_recomputes_and_scores_the_same(make_scheduler):
    sched, runner = make_scheduler(num_blocks=5, block_size=4, budget=3)
    g = sched.add_request(gen("g", [1, 2, 3], max_tokens=12))  # older: grows to 4 blocks
    prompt, conts = [5, 6, 7, 8, 9], [[40, 41, 42, 43, 44, 45, 46, 47], [45]]
    parent = sched.add_request(EngineRequest("p", prompt, continuations=conts))
    finished = run_to_completion(sched, runner)
    (child,) = parent.scoring.children
    assert child.num_preemptions > 0 and sorted(r.request_id for r in finished) == ["g", "p"]
    assert g.output_token_ids == reference_generation([1, 2, 3], 12)
    assert parent.continuation_logprobs() == [reference_scores(prompt, c) for c in conts]
    assert runner.pool.num_used_blocks == 0


def test_scoring_too_long_fails(make_scheduler):
    sched, runner = make_scheduler(max_model_len=8)
    parent = sched.add_request(EngineRequest("p", list(range(1, 7)), continuations=[[1], [1, 2, 3, 4]]))
    assert run_to_completion(sched, runner) == [parent]
    assert parent.finish_reason == "error" and "longest continuation" in parent.error


def test_malformed_requests_raise():
    import pytest

    from bulkrun.engine.core.block_pool import BlockPool
    from bulkrun.engine.core.scheduler import Scheduler

    sched = Scheduler(BlockPool(8, 4), max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    with pytest.raises(ValueError, match="empty list"):
        sched.add_request(EngineRequest("a", [1, 2], continuations=[]))
    with pytest.raises(ValueError, match="continuation 1 has no tokens"):
        sched.add_request(EngineRequest("a", [1, 2], continuations=[[1], []]))
    with pytest.raises(ValueError, match="no tokens"):
        sched.add_request(EngineRequest("a", []))
    with pytest.raises(ValueError, match="invalid token"):
        sched.add_request(EngineRequest("a", [1, -3]))
    sched.add_request(EngineRequest("a", [1]))
    with pytest.raises(ValueError, match="already"):
        sched.add_request(EngineRequest("a", [2]))


def test_random_workload_under_memory_pressure_matches_reference(make_scheduler):
    """Mixed generation and scoring, shared prefixes, a cache too small for everyone at once."""
    rng = random.Random(7)
    for caching in (True, False):
        sched, runner = make_scheduler(
            num_blocks=14, block_size=4, budget=12, max_num_seqs=6, caching=caching, eos=(0,)
        )
        shared = [rng.randrange(1, 60) for _ in range(9)]
        expected = {}
        for i in range(30):
            tail = [rng.randrange(1, 60) for _ in range(rng.randrange(1, 12))]
            prompt = (shared + tail) if i % 2 else tail
            if i % 5 == 4:
                conts = [[rng.randrange(1, 60) for _ in range(rng.randrange(1, 5))] for _ in range(3)]
                sched.add_request(EngineRequest(f"s{i}", prompt, continuations=conts))
                expected[f"s{i}"] = [reference_scores(prompt, c) for c in conts]
            else:
                n = rng.randrange(1, 12)
                sched.add_request(gen(f"g{i}", prompt, max_tokens=n))
                expected[f"g{i}"] = reference_generation(prompt, n)
        finished = run_to_completion(sched, runner)
        got = {r.request_id: r.continuation_logprobs() if r.scoring else r.output_token_ids for r in finished}
        assert got == expected
        assert sched.num_preemptions > 0  # the pool really was too small
        parents = [r for r in finished if r.scoring]
        assert any(p.num_preemptions for p in parents)  # a parent recomputed its prompt
        assert runner.pool.num_used_blocks == 0
        assert not sched._live_ids


def test_finished_blocks_are_freed_tail_first_so_prefixes_stay_cached(make_scheduler):
    sched, runner = make_scheduler(num_blocks=3, block_size=4, budget=64)
    req = sched.add_request(gen("a", range(1, 12), max_tokens=1))  # 11 tokens: 2 full blocks
    run_to_completion(sched, runner)
    pool = runner.pool
    head = pool.lookup_prefix(req.block_hashes[:1])
    assert len(head) == 1 and pool.num_cached_blocks == 2
    assert pool.allocate(2) is not None  # the unhashed tail block, then the LRU one: block 1
    assert pool.lookup_prefix(req.block_hashes[:1]) == head
