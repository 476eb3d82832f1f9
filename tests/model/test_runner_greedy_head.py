"""The runner's screened greedy head: greedy rows without logprobs take it, every other row (logprobs,
sampled, scored) the full fp32 head, in one step, with results identical to a runner without it."""

from __future__ import annotations

import pytest
import torch
from helpers.models import VOCAB, build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scheduler import SchedulerOutput
from bulkrun.engine.core.scoring import ScoringState
from bulkrun.engine.worker.runner import ModelRunner

BLOCK = 4


@pytest.fixture(scope="module", params=["llama", "llama_untied"])  # tied and untied LM heads
def runner(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    build_tiny_model(request.param, folder)
    runner = ModelRunner(str(folder), EngineConfig(block_size=BLOCK, kv_cache_bytes=1 << 20, dtype="float32"))
    if runner.greedy_head is None:
        pytest.skip("the screened greedy head needs the native CPU kernels and native bf16 dot products")
    return runner


def _step(rows=range(6)) -> SchedulerOutput:
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (9, 5, 7, 6, 8, 10)]
    params = [
        SamplingParams(),
        SamplingParams(logprobs=True),
        SamplingParams(temperature=0.8, seed=11),
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=5, seed=3, logprobs=True),
    ]
    scheduled, first_block = [], 0
    for i, (prompt, p) in enumerate(zip(prompts, [*params, SamplingParams()], strict=True)):
        r = Request(f"r{i}", p, list(prompt), len(prompt))
        r.block_table = list(range(first_block, first_block + 3))
        first_block += 3
        scheduled.append((r, len(prompt), i < len(params)))
    scheduled[-1][0].scoring = ScoringState(score_start=6)  # a scoring child: its last 4 tokens are scored
    return SchedulerOutput(scheduled[i] for i in rows)


def test_greedy_rows_are_screened_and_the_rest_use_the_full_head(runner, monkeypatch):
    screened_rows, full_rows = [], []
    head, logits = runner.greedy_head, runner.model.logits
    monkeypatch.setattr(runner, "greedy_head", lambda h: screened_rows.append(len(h)) or head(h))
    monkeypatch.setattr(runner.model, "logits", lambda h: full_rows.append(len(h)) or logits(h))
    with_screen = runner.execute(_step())
    assert screened_rows == [2] and full_rows == [3 + 4]  # r0, r3 | r1, r2, r4 and 4 scored rows

    monkeypatch.setattr(runner, "greedy_head", None)
    without = runner.execute(_step())
    assert with_screen.sampled == without.sampled and len(without.sampled) == 5
    assert with_screen.sampled_logprobs == without.sampled_logprobs
    assert set(with_screen.sampled_logprobs) == {"r1", "r4"}
    assert with_screen.score_logprobs == without.score_logprobs and len(without.score_logprobs["r5"]) == 4


def test_a_step_of_greedy_rows_alone_runs_no_full_head_rows(runner, monkeypatch):
    full_rows = []
    logits = runner.model.logits
    monkeypatch.setattr(runner.model, "logits", lambda h: full_rows.append(len(h)) or logits(h))
    out = _step(rows=(0, 3))
    with_screen = runner.execute(out)
    assert full_rows == [0]

    monkeypatch.setattr(runner, "greedy_head", None)
    assert runner.execute(out).sampled == with_screen.sampled and full_rows == [0, 2]
