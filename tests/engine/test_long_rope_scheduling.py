"""LongRoPE in the scheduler (long_rope_after = N): a request runs on the short factors while it holds
at most N tokens and on the long ones, at every position, once it holds more, as transformers' Phi-3
does by dropping its cache; blocks of one kind never serve a request of the other.

The fake runner (engine_fakes.py) asserts the factors of every generating row and salts its KV
fingerprints with them, so a wrong switch or a prefix hit across the two kinds fails loudly.
"""

from __future__ import annotations

from engine_fakes import reference_generation, reference_scores, run_to_completion

from bulkrun.engine.core.params import EngineRequest, SamplingParams

N = 10


def gen(rid, prompt, max_tokens):
    return EngineRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def rows_of(runner, rid):
    return [(start, n, sample) for step in runner.steps for r, start, n, sample in step if r == rid]


def test_a_request_growing_past_n_recomputes_every_position_on_the_long_factors(make_scheduler):
    sched, runner = make_scheduler(block_size=4, long_rope_after=N)
    req = sched.add_request(gen("a", range(1, 7), max_tokens=9))
    assert run_to_completion(sched, runner) == [req]
    assert req.output_token_ids == reference_generation(list(range(1, 7)), 9)
    # 6 prompt tokens, decodes up to position 9 (10 tokens), then the 11 tokens again, on the long factors
    assert rows_of(runner, "a") == [(0, 6, True), (6, 1, True), (7, 1, True), (8, 1, True), (9, 1, True),
                                    (0, 11, True), (11, 1, True), (12, 1, True), (13, 1, True)]  # fmt: skip
    assert req.long_rope and req.num_preemptions == 0 and sched.num_preemptions == 0


def test_prompts_past_n_run_on_the_long_factors_from_the_start(make_scheduler):
    sched, runner = make_scheduler(block_size=4, budget=5, long_rope_after=N)
    long = sched.add_request(gen("long", range(1, 13), max_tokens=3))
    exact = sched.add_request(gen("exact", range(20, 30), max_tokens=3))  # N tokens: short, then long
    run_to_completion(sched, runner)
    assert [start for start, _, _ in rows_of(runner, "long")] == [0, 5, 10, 12, 13]  # chunks, no restart
    starts = [start for start, _, _ in rows_of(runner, "exact")]
    assert starts.count(0) == 2  # its prompt, then at N + 1 tokens all of it again
    assert long.output_token_ids == reference_generation(list(range(1, 13)), 3)
    assert exact.output_token_ids == reference_generation(list(range(20, 30)), 3)


def test_prefix_hits_stay_within_one_kind_of_factors(make_scheduler):
    sched, runner = make_scheduler(block_size=4, long_rope_after=N)
    prompt = list(range(1, 17))
    long = sched.add_request(gen("long", prompt, max_tokens=20))  # 4 full blocks on the long factors
    sched.update(out := sched.schedule(), runner.execute(out))
    # the same first 9 tokens on the short factors: the long blocks must not serve it
    short = sched.add_request(gen("short", prompt[:9], max_tokens=6))
    sched.update(out := sched.schedule(), runner.execute(out))
    assert out.num_prefix_hit_tokens == 0 and not short.long_rope
    # a short sharer is served by the short request's blocks
    again = sched.add_request(gen("again", prompt[:9], max_tokens=1))
    sched.update(out := sched.schedule(), runner.execute(out))
    assert again.num_cached_tokens == 8 and out.num_prefix_hit_tokens == 8
    hits = []
    while sched.has_unfinished():
        sched.update(out := sched.schedule(), runner.execute(out))
        hits.append(out.num_prefix_hit_tokens)
    # past N the short request recomputes on the long factors, and as its tokens are the long
    # prompt's (the fake model counts up), the long blocks serve that recompute: two full blocks
    # and the third's first two tokens, copied
    assert short.long_rope and max(hits) == 10
    assert short.num_cached_tokens == 0  # counted at its first admission only
    assert short.output_token_ids == reference_generation(prompt[:9], 6)
    assert long.output_token_ids == reference_generation(prompt, 20)


def test_preemption_around_the_switch_recomputes_on_the_right_factors(make_scheduler):
    sched, runner = make_scheduler(num_blocks=9, block_size=4, budget=8, long_rope_after=N)
    prompts = {f"r{i}": list(range(3 * i + 1, 3 * i + 6 + i)) for i in range(4)}
    reqs = [sched.add_request(gen(rid, p, max_tokens=10)) for rid, p in prompts.items()]
    run_to_completion(sched, runner)
    assert sched.num_preemptions > 0  # the pool really was too small
    for req, prompt in zip(reqs, prompts.values(), strict=True):
        assert req.output_token_ids == reference_generation(prompt, 10) and req.long_rope


def test_engine_with_tokens_in_flight_at_the_switch(make_engine):
    # async: the token at position N may still be in flight; the request waits for it, then switches
    engine, _ = make_engine(block_size=4, long_rope_after=N, max_num_batched_tokens=16)
    prompts = [list(range(1, 4)), list(range(5, 15)), list(range(20, 33)), [7]]
    outs = engine.generate([gen(f"g{i}", p, max_tokens=12) for i, p in enumerate(prompts)])
    assert [o.output_token_ids for o in outs] == [reference_generation(p, 12) for p in prompts]


def test_a_scoring_family_runs_on_one_kind_of_factors(make_scheduler):
    sched, runner = make_scheduler(block_size=4, long_rope_after=N)
    prompt = list(range(1, 7))
    past = sched.add_request(
        EngineRequest("past", prompt, SamplingParams(), continuations=[[9, 9, 9, 9, 9, 9], [4]])
    )
    within = sched.add_request(
        EngineRequest("within", prompt, SamplingParams(), continuations=[[9, 9], [4, 5]])
    )
    run_to_completion(sched, runner)
    # the most positions a member computes: 6 + 6 - 1 = 11 > N, and 6 + 2 - 1 = 7
    assert past.long_rope and all(c.long_rope for c in past.scoring.children)
    assert not within.long_rope and not any(c.long_rope for c in within.scoring.children)
    assert past.continuation_logprobs() == [reference_scores(prompt, [9] * 6), reference_scores(prompt, [4])]
    assert within.continuation_logprobs() == [
        reference_scores(prompt, [9, 9]),
        reference_scores(prompt, [4, 5]),
    ]
