"""Engine over the fake runner: stop strings, text, backpressure, order, scoring, stats."""

from __future__ import annotations

import pytest
from engine_fakes import (
    SPECIAL,
    ToyTokenizer,
    reference_generation,
    reference_scores,
    sampled_logprob,
)

from bulkrun.engine.core.params import EngineRequest, SamplingParams

TOK = ToyTokenizer()


def gen(rid, prompt, max_tokens=4, **params):
    return EngineRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens, **params))


def test_generate_returns_results_in_request_order(make_engine):
    engine, _ = make_engine(max_num_batched_tokens=16)
    reqs = [gen(f"r{i}", range(1, 2 + i * 3), max_tokens=8 - i) for i in range(6)]
    outs = engine.generate(reqs)
    assert [o.request_id for o in outs] == [r.request_id for r in reqs]
    for req, out in zip(reqs, outs, strict=True):
        expected = reference_generation(req.prompt_token_ids, req.params.max_tokens)
        assert out.output_token_ids == expected and out.finish_reason == "length"
        assert out.text == TOK.decode(expected) and out.prompt_token_ids == req.prompt_token_ids


def test_step_returns_results_in_completion_order(make_engine):
    engine, _ = make_engine()
    engine.add_request(gen("slow", [1], max_tokens=6))
    engine.add_request(gen("fast", [1], max_tokens=2))
    order = []
    while engine.has_unfinished():
        order += [o.request_id for o in engine.step()]
    assert order == ["fast", "slow"]


def test_stop_string_ends_generation_and_is_cut_from_text(make_engine):
    engine, runner = make_engine()
    # the fake model continues 1 -> 2, 3, 4, 5, 6 ...: text "bcdef..."
    out = engine.generate([gen("s", [1], max_tokens=20, stop=("xyz", "de"))])[0]
    assert out.finish_reason == "stop" and out.text == "bc"
    assert out.output_token_ids == [2, 3, 4, 5]  # tokens up to the one that completed the stop
    assert engine.pool.num_used_blocks == 0 or engine.pool.num_free_blocks == engine.pool.num_blocks
    # nothing computed after the stop (async: at most the one step scheduled ahead of it)
    assert len(runner.steps) == 4 + engine.async_scheduling


def test_stop_string_on_the_last_allowed_token_still_reports_stop(make_engine):
    engine, _ = make_engine()
    out = engine.generate([gen("s", [1], max_tokens=3, stop=("d",))])[0]
    assert (out.finish_reason, out.text, out.output_token_ids) == ("stop", "bc", [2, 3, 4])


def test_stop_string_that_never_appears_leaves_full_text(make_engine):
    engine, _ = make_engine()
    out = engine.generate([gen("s", [1], max_tokens=3, stop=("zz",))])[0]
    assert (out.finish_reason, out.text) == ("length", "bcd")


def test_eos_is_kept_in_tokens_but_not_in_text(make_engine):
    engine, _ = make_engine()
    out = engine.generate([gen("e", [62], max_tokens=5)])[0]  # 62 -> 63 -> 0 (eos)
    assert out.output_token_ids == [63, SPECIAL] and out.finish_reason == "stop"
    assert out.text == TOK.decode([63])
    ignored = engine.generate([gen("i", [62], max_tokens=3, ignore_eos=True)])[0]
    assert ignored.output_token_ids == [63, 0, 1] and ignored.finish_reason == "length"


def test_stop_token_text_is_left_out(make_engine):
    engine, _ = make_engine()
    out = engine.generate([gen("t", [1], max_tokens=9, stop_token_ids=(4,))])[0]
    assert out.output_token_ids == [2, 3, 4] and out.text == "bc" and out.finish_reason == "stop"


def test_logprobs_of_generated_tokens(make_engine):
    engine, _ = make_engine()
    with_lp, without = engine.generate([gen("a", [5, 6], logprobs=True), gen("b", [5, 6])])
    ids = [5, 6] + with_lp.output_token_ids
    assert with_lp.logprobs == [
        sampled_logprob(ids[: 2 + i], t) for i, t in enumerate(with_lp.output_token_ids)
    ]
    assert without.logprobs is None


def test_scoring_request_returns_continuation_logprobs_in_order(make_engine):
    engine, _ = make_engine(block_size=4)
    prompt = list(range(1, 15))
    conts = [[7, 8, 9], [20], [30, 31]]
    out = engine.generate([EngineRequest("score", prompt, continuations=conts)])[0]
    assert out.finish_reason == "scored" and out.output_token_ids == []
    assert out.continuation_logprobs == [reference_scores(prompt, c) for c in conts]
    assert out.scores == pytest.approx([sum(reference_scores(prompt, c)) for c in conts])


def test_single_token_scoring_runs_only_the_prompt_and_mixed_sets_fork_only_long_ones(make_engine):
    engine, runner = make_engine(block_size=4)
    prompt = list(range(1, 15))
    single, mixed = [[20], [21], [22]], [[20], [30, 31], [22], [40, 41, 42]]
    outs = engine.generate(
        [
            EngineRequest("one", prompt, continuations=single),
            EngineRequest("mix", prompt, continuations=mixed),
        ]
    )
    assert [o.continuation_logprobs for o in outs] == [
        [reference_scores(prompt, c) for c in single],
        [reference_scores(prompt, c) for c in mixed],
    ]
    computed = {rid for step in runner.steps for rid, *_ in step}
    assert computed == {"one", "mix", "mix::cont1", "mix::cont3"}
    # the single-token set cost exactly its prompt: 14 tokens, one chunk
    assert [(start, n) for step in runner.steps for rid, start, n, _ in step if rid == "one"] == [(0, 14)]


def test_request_that_can_never_fit_comes_back_as_an_error(make_engine):
    engine, _ = make_engine(num_blocks=4, block_size=4)
    outs = engine.generate([gen("big", range(1, 30)), gen("ok", [1, 2])])
    assert outs[0].finish_reason == "error" and "KV-cache blocks" in outs[0].error
    assert outs[1].finish_reason == "length" and outs[1].error is None


def test_malformed_requests(make_engine):
    engine, _ = make_engine()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request(gen("v", [1, 999]))
    with pytest.raises(ValueError, match="distinct"):
        engine.generate([gen("d", [1]), gen("d", [2])])
    # stream() turns a malformed request into an error result and goes on
    outs = list(engine.stream([EngineRequest("bad", [1], continuations=[]), gen("good", [1])]))
    assert [(o.request_id, o.finish_reason) for o in outs] == [("bad", "error"), ("good", "length")]
    assert "empty list" in outs[0].error


def test_backpressure_stream_pulls_requests_lazily(make_engine):
    engine, _ = make_engine(max_waiting=2, max_num_seqs=2)
    pulled = []

    def requests():
        for i in range(10):
            pulled.append(i)
            yield gen(f"r{i}", [1, 2], max_tokens=3)

    engine.add_request(gen("x", [1]))
    engine.add_request(gen("y", [1]))
    assert not engine.has_capacity()  # two waiting
    stream = engine.stream(requests())
    first = next(stream)
    assert len(pulled) < 10  # it did not swallow the whole input
    rest = list(stream)
    assert sorted(o.request_id for o in [first, *rest]) == sorted(["x", "y"] + [f"r{i}" for i in range(10)])
    assert not engine.has_unfinished()


def test_step_stats(make_engine):
    engine, _ = make_engine(num_blocks=8, block_size=4, max_num_batched_tokens=64)
    prompt = list(range(1, 14))
    engine.add_request(gen("a", prompt, max_tokens=3))
    engine.step()
    s = engine.last_stats
    assert (s.num_scheduled_tokens, s.num_prefill_tokens, s.num_decode_tokens) == (13, 13, 0)
    assert (s.num_running, s.kv_blocks_used, s.kv_blocks_total, s.num_generated_tokens) == (1, 4, 8, 1)
    engine.step()
    assert (engine.last_stats.num_decode_tokens, engine.last_stats.num_prefill_tokens) == (1, 0)
    while engine.has_unfinished():
        engine.step()
    assert engine.last_stats.num_finished == 1 and engine.last_stats.kv_blocks_used == 0


def test_stream_reports_every_step(make_engine):
    engine, _ = make_engine(num_blocks=8, block_size=4, max_num_batched_tokens=64)
    prompt = list(range(1, 14))
    steps = []
    outs = list(engine.stream([gen("a", prompt, max_tokens=3)], on_step=steps.append))
    outs += list(engine.stream([gen("b", prompt, max_tokens=3)], on_step=steps.append))  # 12 cached
    assert [o.request_id for o in outs] == ["a", "b"]
    # async: one more step per request, the one in which its last token lands
    assert len(steps) == 6 + 2 * engine.async_scheduling and sum(s.num_finished for s in steps) == 2
    assert sum(s.num_generated_tokens for s in steps) == 6
    assert sum(s.num_scheduled_tokens for s in steps) == (13 + 1 + 1) + (1 + 1 + 1)
    assert sum(s.prefix_cache_hit_tokens for s in steps) == 12
    assert sum(s.num_preempted for s in steps) == 0
    assert max(s.kv_blocks_used for s in steps) == 4 and steps[-1].kv_blocks_used == 0


def test_preemptions_are_counted_and_outputs_unchanged(make_engine):
    engine, _ = make_engine(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    reqs = [gen(f"r{i}", range(10 * i + 1, 10 * i + 10), max_tokens=10) for i in range(3)]
    steps = []
    outs = list(engine.stream(reqs, on_step=steps.append))
    outs.sort(key=lambda o: int(o.request_id[1:]))
    assert sum(s.num_preempted for s in steps) > 0
    for req, out in zip(reqs, outs, strict=True):
        assert out.output_token_ids == reference_generation(req.prompt_token_ids, 10)


def test_max_model_len_from_config_caps_the_model(make_engine):
    engine, _ = make_engine(max_model_len=256, eos=())
    assert engine.max_model_len == 256
    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.core.engine import Engine

    capped = Engine(engine.runner, EngineConfig(block_size=4, max_model_len=6))
    engine.runner.pool, engine.runner.in_flight = capped.pool, capped.scheduler.kv.in_flight
    out = capped.generate([gen("c", [1, 2, 3], max_tokens=50)])[0]
    assert capped.max_model_len == 6 and out.output_token_ids == [4, 5, 6] and out.finish_reason == "length"


@pytest.fixture(scope="module")
def real_tokenizer():
    from transformers import AutoTokenizer

    from bulkrun.model_source import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None))


def test_incremental_detokenization_matches_full_decode(real_tokenizer):
    from bulkrun.engine.core.stop import StopStringMatcher, decode_output

    tok = real_tokenizer
    prompt = tok.encode("Say something:")
    answer = " Grüße aus Köln 🙂🎉 — 東京 def f(x):\n    return x  END and more"
    ids = prompt + tok.encode(answer)
    follow = StopStringMatcher(tok, ("NEVER",), len(prompt))
    stopper = StopStringMatcher(tok, (" END", "more"), len(prompt))
    stopped_at = None
    for end in range(len(prompt) + 1, len(ids) + 1):
        assert not follow.update(ids[:end])
        if stopped_at is None and stopper.update(ids[:end]):
            stopped_at = end
    assert follow.text == decode_output(tok, ids, len(prompt), len(ids)) == answer
    assert stopper.stopped and stopper.text == answer[: answer.index(" END")]
    assert tok.decode(ids[len(prompt) : stopped_at]).endswith(" END")  # found as soon as it completed


def test_async_scheduling_gives_the_same_results_under_memory_pressure():
    """Generation with EOS, stop strings, logprobs and max_tokens, and scoring, in a cache too
    small for everyone (preemptions): async scheduling changes when results land, not what they are."""
    import random

    from engine_fakes import FakeRunner

    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.core.engine import Engine

    rng = random.Random(3)
    requests = []
    for i in range(40):
        prompt = [rng.randrange(1, 60) for _ in range(rng.randrange(1, 14))]
        if i % 4 == 3:
            conts = [[rng.randrange(1, 60) for _ in range(rng.randrange(1, 5))] for _ in range(3)]
            requests.append(EngineRequest(f"s{i}", prompt, continuations=conts))
        else:
            stop = ("fg",) if i % 3 == 0 else ()
            requests.append(
                gen(f"g{i}", prompt, max_tokens=rng.randrange(1, 16), stop=stop, logprobs=i % 5 == 0)
            )
    results = {}
    for flag in (False, True):
        runner = FakeRunner(num_blocks=16, block_size=4)
        engine = Engine(runner, EngineConfig(block_size=4, max_num_batched_tokens=12, max_num_seqs=6,
                                             async_scheduling=flag))  # fmt: skip
        runner.pool, runner.in_flight = engine.pool, engine.scheduler.kv.in_flight
        steps = []
        outs = list(engine.stream(requests, on_step=steps.append))
        assert sum(s.num_preempted for s in steps) > 0  # the pool really was too small
        assert engine.pool.num_used_blocks == 0 and not engine.has_unfinished()
        results[flag] = sorted(
            (o.request_id, o.output_token_ids, o.text, o.finish_reason, o.logprobs, o.continuation_logprobs)
            for o in outs
        )
    assert results[True] == results[False]
    assert any(r[3] == "stop" for r in results[True])


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_device_that_answers_late_gives_the_reference_tokens(async_scheduling):
    """With async scheduling the next step is launched before this one's tokens land; its inputs
    then come from the device side of the runner."""
    from engine_fakes import SimulatedDeviceRunner

    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.core.engine import Engine

    runner = SimulatedDeviceRunner(device_seconds=0.001, num_blocks=64, block_size=4)
    engine = Engine(
        runner, EngineConfig(block_size=4, max_num_batched_tokens=16, async_scheduling=async_scheduling)
    )
    requests = [gen(f"r{i}", range(1 + i, 4 + 2 * i), max_tokens=3 + i) for i in range(8)]
    outs = engine.generate(requests)
    for req, out in zip(requests, outs, strict=True):
        assert out.output_token_ids == reference_generation(req.prompt_token_ids, req.params.max_tokens)
