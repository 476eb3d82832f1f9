"""The step budget chosen for the device when the user gives none."""

from __future__ import annotations

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.limits import choose_limits


def test_a_large_gpu_gets_vllm_sized_steps():
    limits = choose_limits(EngineConfig(), "cuda", 141 << 30)
    assert (limits.max_num_batched_tokens, limits.max_num_seqs, limits.chosen_for_device) == (
        16384,
        1024,
        True,
    )
    small = choose_limits(EngineConfig(), "cuda", 24 << 30)
    assert (small.max_num_batched_tokens, small.max_num_seqs) == (8192, 256)


def test_the_cpu_takes_smaller_steps_and_the_user_value_wins():
    cpu = choose_limits(EngineConfig(), "cpu")
    assert (cpu.max_num_batched_tokens, cpu.max_num_seqs) == (2048, 256)
    mine = choose_limits(EngineConfig(max_num_batched_tokens=512, max_num_seqs=8), "cuda", 141 << 30)
    assert (mine.max_num_batched_tokens, mine.max_num_seqs, mine.chosen_for_device) == (512, 8, False)
    assert set(mine.as_dict()) >= {
        "max_num_seqs",
        "max_num_batched_tokens",
        "num_kv_blocks",
        "profile_peak_bytes",
    }


def test_the_engine_runs_with_the_limits_the_runner_chose(make_engine):
    engine, runner = make_engine()
    assert engine.scheduler.max_num_batched_tokens == 2048 and engine.limits.device == "cpu"
    runner.limits = choose_limits(EngineConfig(), "cuda", 141 << 30)
    from bulkrun.engine.core.engine import Engine

    assert Engine(runner, EngineConfig(block_size=4)).scheduler.max_num_seqs == 1024
