"""plan's figures as pure functions of counted prompts, a measured sample and the engine's sizes."""

import datetime
import json

import pytest

from bulkrun.job.plan_estimate import (
    PlanInputs,
    PromptTokenStats,
    SampleRun,
    StepCost,
    StepTiming,
    cacheable_prefix,
    estimate_plan,
    fit_step_cost,
    format_plan,
    simulate_steps,
    simulated_seconds,
)
from bulkrun.job.prices import Price

PREFIX = list(range(1000, 1040))  # a 40-token shared instruction


def stats(prompts):
    s = PromptTokenStats()
    for ids in prompts:
        s.add(ids)
    return s


def job_prompts(lengths):
    """Prompts that share PREFIX, then differ (each row's own tokens)."""
    return [PREFIX + [row] * (length - len(PREFIX)) for row, length in enumerate(lengths)]


def test_prompt_stats_are_exact():
    s = stats(job_prompts([50, 60, 70, 80, 100]))
    assert (s.count, s.total, s.shared_prefix_len) == (5, 360, 40)
    assert [s.percentile(q) for q in (0, 20, 50, 90, 99, 100)] == [50, 50, 70, 100, 100, 100]
    assert PromptTokenStats().percentile(50) == 0 and PromptTokenStats().shared_prefix_len == 0


def test_shared_prefix_shrinks_to_what_all_prompts_share():
    s = stats([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2]])
    assert s.shared_prefix_len == 2
    s.add([7, 2])
    assert s.shared_prefix_len == 0


def test_cacheable_prefix_is_the_shared_tokens_but_never_a_whole_prompt():
    assert cacheable_prefix(stats(job_prompts([50, 60]))) == 40  # two blocks of 16 and 8 tokens copied
    assert cacheable_prefix(stats([list(range(32)), list(range(40))])) == 31  # 32 is a whole prompt
    assert cacheable_prefix(stats([])) == 0


def test_plan_figures_from_a_sample():
    prompts = stats(job_prompts([50] * 90 + [100] * 10))  # total 5,500
    sample = SampleRun(
        requests=10, prompt_tokens=550, cached_prompt_tokens=288, generated_tokens=200, seconds=4.62
    )
    price = Price("p", "m", 1.0, 2.0, datetime.date(2026, 12, 1))
    plan = estimate_plan(
        PlanInputs(
            prompts,
            {"empty_text": 2, "bad_json": 1},
            max_tokens=64,
            sample=sample,
            kv_bytes_per_token=100,
            kv_available_bytes=10**6,
            max_seqs=8,
            prices=[price],
        )
    )
    assert (plan.rows, plan.good_rows, plan.requests) == (103, 100, 100)
    assert plan.errors_by_kind == {"bad_json": 1, "empty_text": 2}
    assert plan.prompt_tokens == 5500 and plan.prompt_percentiles == {
        "p50": 50,
        "p90": 50,
        "p99": 100,
        "max": 100,
    }
    assert plan.prefix_cache_saved_tokens == 40 * 99  # two blocks and 8 tokens copied
    assert (plan.generated_tokens_bound, plan.generated_tokens_estimate) == (6400, 2000)
    assert plan.engine_tokens_per_s == pytest.approx((550 - 288 + 200) / 4.62)
    assert plan.wall_seconds_estimate == pytest.approx((5500 - 3960 + 2000) / plan.engine_tokens_per_s)
    assert plan.kv_bytes_largest_request == 176 * 100  # 100 + 64 tokens -> 11 blocks of 16
    # 8 running requests of mean 55 prompt + 20 generated = 75 -> 80 slots, the prefix's 2 blocks held once
    assert plan.kv_bytes_full_batch == (8 * 80 - 7 * 32) * 100
    [cost] = plan.costs
    assert cost["usd"] == pytest.approx((5500 * 1.0 + 2000 * 2.0) / 1e6)
    assert cost["usd_bound"] == pytest.approx((5500 * 1.0 + 6400 * 2.0) / 1e6)
    json.dumps(plan.as_dict())  # --json


def test_workers_divide_the_time_and_each_computes_the_prefix_once():
    prompts = stats(job_prompts([48] * 40))
    sample = SampleRun(
        requests=4, prompt_tokens=192, cached_prompt_tokens=0, generated_tokens=40, seconds=2.0
    )
    one = estimate_plan(PlanInputs(prompts, {}, max_tokens=16, sample=sample))
    four = estimate_plan(PlanInputs(prompts, {}, max_tokens=16, sample=sample, workers=4))
    assert one.prefix_cache_saved_tokens - four.prefix_cache_saved_tokens == 40 * 3
    rate = (192 + 40) / 2.0
    assert one.wall_seconds_estimate == pytest.approx((1920 - 40 * 39 + 400) / rate)
    assert four.wall_seconds_estimate == pytest.approx((1920 - 40 * 36 + 400) / rate / 4)


def test_without_a_sample_only_bounds_are_given():
    plan = estimate_plan(
        PlanInputs(
            stats(job_prompts([45, 45])), {}, max_tokens=10, n=3, prefix_cache=False, kv_bytes_per_token=1
        )
    )
    assert (plan.requests, plan.generated_tokens_bound, plan.generated_tokens_estimate) == (6, 60, None)
    assert plan.wall_seconds_estimate is None and plan.prefix_cache_saved_tokens == 0
    assert plan.kv_bytes_full_batch == 6 * 64  # 45 + 10 tokens -> 4 blocks each, nothing shared


def test_the_sample_mean_never_exceeds_the_bound():
    sample = SampleRun(
        requests=1, prompt_tokens=50, cached_prompt_tokens=0, generated_tokens=500, seconds=1.0
    )
    plan = estimate_plan(PlanInputs(stats(job_prompts([50] * 3)), {}, max_tokens=8, sample=sample))
    assert plan.generated_tokens_estimate == plan.generated_tokens_bound == 24


def test_an_input_with_only_bad_rows():
    plan = estimate_plan(PlanInputs(PromptTokenStats(), {"empty_text": 4}, max_tokens=8))
    assert (plan.rows, plan.good_rows, plan.prompt_tokens, plan.kv_bytes_full_batch) == (4, 0, 0, 0)
    assert "empty_text 4" in format_plan(plan)


def test_format_plan_names_every_figure():
    sample = SampleRun(
        requests=2, prompt_tokens=100, cached_prompt_tokens=0, generated_tokens=20, seconds=1.0
    )
    price = Price("openai", "gpt-x", 0.1, 0.4, datetime.date(2026, 12, 1))
    plan = estimate_plan(
        PlanInputs(
            stats(job_prompts([50, 50])),
            {},
            max_tokens=16,
            sample=sample,
            kv_bytes_per_token=2048,
            kv_available_bytes=2**30,
            prices=[price],
        )
    )
    text = format_plan(plan)
    for needle in (
        "rows              2 (2 good; bad rows: none)",
        "prompt tokens     100 (p50 50",
        "prefix cache saves 40",
        "about 20 (sample)",
        "120.0 engine tokens/s",
        "wall time         about 1 s",
        "available 1.0 GiB",
        "openai/gpt-x",
        "as of 2026-12-01",
    ):
        assert needle in text


def timed_steps(cost, shapes):
    """Steps of the given (prefill, decode) shapes that took exactly what `cost` says, after a slow
    warm-up step."""
    return (StepTiming(500, 0, 99.0),) + tuple(StepTiming(p, d, cost(p, d)) for p, d in shapes)


def test_the_step_cost_fit_recovers_a_linear_cost():
    truth = StepCost(fixed=0.05, per_prefill_token=0.001, per_decode_row=0.004)
    steps = timed_steps(truth, [(1024, 0), (1000, 24), (200, 32), (0, 32), (0, 20), (0, 8)])
    fit = fit_step_cost(steps)  # the warm-up step is left out, or the fixed cost would be far off
    assert fit.fixed == pytest.approx(0.05) and fit.per_prefill_token == pytest.approx(0.001)
    assert fit.per_decode_row == pytest.approx(0.004)


def test_the_step_cost_fit_never_goes_negative():
    # decode steps that got cheaper with more rows (noise): no negative per-row cost
    steps = (StepTiming(0, 1, 1.0),) + tuple(StepTiming(0, d, 1.0 - d / 100) for d in (4, 8, 16, 32))
    fit = fit_step_cost(steps)
    assert min(fit.fixed, fit.per_prefill_token, fit.per_decode_row) >= 0
    assert fit_step_cost(steps[:3]) is None  # too few steps left after the warm-up


def test_simulated_steps_follow_the_scheduler():
    # 3 requests of 10 prompt tokens generating 3 tokens, 2 at a time, 16 tokens a step:
    # step 1 prefills the first and 6 of the second; its last chunk ends in step 2 with a decode of the first
    assert simulate_steps([10, 10, 10], [3, 3, 3], max_seqs=2, token_budget=16) == [
        (16, 0),
        (4, 1),  # the first decodes; the second finishes its prompt; the third waits for a seat
        (0, 2),  # the first finishes
        (10, 1),  # the third is admitted and prefilled while the second decodes its last token
        (0, 1),
        (0, 1),
    ]
    assert sum(p for p, _ in simulate_steps([7] * 50, [5] * 50, 8, 64)) == 350
    assert sum(d for _, d in simulate_steps([7] * 50, [5] * 50, 8, 64)) == 50 * 4


def test_decode_rows_cost_a_prompt_token_when_the_sample_cannot_tell_them_from_the_fixed_cost():
    # every decode step of the sample has 32 rows: fixed and per-row cost are one number there
    truth = StepCost(fixed=0.05, per_prefill_token=0.001, per_decode_row=0.004)
    steps = timed_steps(truth, [(1024, 0), (1024, 0), (512, 0)] + [(0, 32)] * 8)
    fit = fit_step_cost(steps)
    assert fit.per_decode_row == fit.per_prefill_token == pytest.approx(0.001, rel=0.15)
    assert fit(0, 32) == pytest.approx(truth(0, 32), rel=0.1)  # the shapes the sample saw stay close
    assert fit(1024, 0) == pytest.approx(truth(1024, 0), rel=0.1)


def test_a_job_that_runs_more_at_once_is_estimated_by_its_step_shapes():
    # a fixed cost per step dominates: 160 requests 128 at a time take far fewer steps per request
    # than the 32-request sample suggests, so the estimate is not the sample's tokens/s scaled
    cost = StepCost(fixed=0.1, per_prefill_token=0.001, per_decode_row=0.001)
    lengths = tuple([16] * 32)
    shapes = simulate_steps([100] * 32, list(lengths), 128, 1024)
    sample = SampleRun(
        requests=32, prompt_tokens=3200, cached_prompt_tokens=0, generated_tokens=512,
        seconds=sum(cost(p, d) for p, d in shapes), steps=timed_steps(cost, shapes), generated_lengths=lengths,
    )  # fmt: skip
    prompts = stats([[row] * 100 for row in range(160)])
    plan = estimate_plan(
        PlanInputs(
            prompts, {}, max_tokens=16, sample=sample, max_seqs=128, token_budget=1024, read_seconds=2.0
        )
    )
    job = sum(cost(p, d) for p, d in simulate_steps([100] * 160, [16] * 160, 128, 1024))
    assert plan.wall_seconds_estimate == pytest.approx(job + 2.0)
    assert plan.wall_seconds_estimate < 5 * sample.seconds + 2.0  # tokens/s would say 5 x the sample
    assert plan.step_cost["fixed"] == pytest.approx(0.1)
    assert "step cost         100.0 ms + 1.000 ms per prompt token + 1.000 ms per decode row" in format_plan(
        plan
    )
    two = estimate_plan(
        PlanInputs(prompts, {}, max_tokens=16, sample=sample, max_seqs=128, token_budget=1024, workers=2)
    )
    half = sum(cost(p, d) for p, d in simulate_steps([100] * 80, [16] * 80, 128, 1024))
    assert two.wall_seconds_estimate == pytest.approx(half)


def test_a_large_job_is_simulated_in_part_and_scaled():
    cost = StepCost(fixed=0.01, per_prefill_token=0.0, per_decode_row=0.001)
    small = simulated_seconds(cost, 8192, 8192 * 20, [4], max_seqs=64, token_budget=512)
    large = simulated_seconds(cost, 81920, 81920 * 20, [4], max_seqs=64, token_budget=512)
    assert large == pytest.approx(10 * small, rel=0.01)
    assert simulated_seconds(cost, 0, 0, [4], 64, 512) == 0.0
