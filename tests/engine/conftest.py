"""Fixtures for the engine tests (the test doubles live in engine_fakes.py)."""

from __future__ import annotations

import pytest
from engine_fakes import SPECIAL, FakeRunner

from bulkrun.engine.core.block_pool import BlockPool
from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.core.scheduler import Scheduler


@pytest.fixture
def make_scheduler():
    """Scheduler over a fresh pool, with a fake runner wired to check its KV use."""

    def build(
        num_blocks=64, block_size=4, max_num_seqs=8, budget=32, max_model_len=256, caching=True, eos=(),
        long_rope_after=None,
    ):  # fmt: skip
        runner = FakeRunner(num_blocks, block_size, max_model_len, eos, long_rope_after)
        pool = BlockPool(num_blocks, block_size, caching)
        runner.pool = pool
        sched = Scheduler(
            pool,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            eos_token_ids=eos,
            long_rope_after=long_rope_after,
        )
        runner.in_flight = sched.kv.in_flight
        return sched, runner

    return build


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def make_engine(request):
    """Engine over a fake runner; every test runs with async scheduling off and on."""

    def build(num_blocks=64, block_size=4, max_model_len=256, eos=(SPECIAL,), long_rope_after=None, **config):
        runner = FakeRunner(num_blocks, block_size, max_model_len, eos, long_rope_after)
        config.setdefault("async_scheduling", request.param)
        engine = Engine(runner, EngineConfig(block_size=block_size, **config))
        runner.pool, runner.in_flight = engine.pool, engine.scheduler.kv.in_flight
        return engine, runner

    return build
