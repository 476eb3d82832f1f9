"""The largest step the KV cache is sized around: its layout, its bytes at real model sizes (1B and 8B
on 80 and 141 GiB devices), and the step itself built through a RunningBatch on the CPU."""

from __future__ import annotations

import pytest
from helpers.models import build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.limits import choose_limits
from bulkrun.engine.worker import memory_profile as mp
from bulkrun.engine.worker.runner import ModelRunner

GIB = 1 << 30
LLAMA_1B = mp.ModelShape(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
LLAMA_8B = mp.ModelShape(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256)


def test_the_largest_step_fills_the_budget_in_as_few_sequences_as_the_context_allows():
    assert mp.profile_step_lengths(16384, 4096) == [4096] * 4
    assert mp.profile_step_lengths(16384, 131072) == [16384]
    assert mp.profile_step_lengths(10000, 4096) == [4096, 4096, 1808]
    assert mp.describe([4096] * 4, 1024, 10 * GIB).startswith("16384 tokens (4 x 4096), every row scored")


@pytest.mark.parametrize(
    "shape,tied,memory_gib,weights_gib,peak_gib,kv_gib",
    [
        (LLAMA_1B, True, 80, 2.30, 9.35, 60.6),
        (LLAMA_1B, True, 141, 2.30, 9.35, 115.5),
        (LLAMA_8B, False, 80, 14.96, 10.19, 48.3),
        (LLAMA_8B, False, 141, 14.96, 10.19, 103.2),
    ],
    ids=["1b-80", "1b-141", "8b-80", "8b-141"],
)
def test_sizing_at_real_model_sizes(shape, tied, memory_gib, weights_gib, peak_gib, kv_gib):
    limits = choose_limits(EngineConfig(), "cuda", memory_gib * GIB)
    assert (limits.max_num_batched_tokens, limits.max_num_seqs) == (16384, 1024)
    step = mp.largest_step_bytes(shape, limits.max_num_batched_tokens, limits.max_num_seqs, dtype_bytes=2)
    assert step["logits"] == 16384 * 128256 * 2  # every row's logits, as a scoring step needs them
    assert step["sampler"] == 1024 * 128256 * 20  # a full-vocabulary sort for every sampling row
    assert step["total"] / GIB == pytest.approx(peak_gib, abs=0.01)
    weights = mp.weight_bytes(shape, 2, tied)  # bf16: 1.24B and 8.03B parameters
    assert weights / GIB == pytest.approx(weights_gib, abs=0.01)
    kv = mp.kv_cache_bytes(memory_gib * GIB - weights, step["total"])
    assert kv / GIB == pytest.approx(kv_gib, abs=0.1)
    assert weights + kv + step["total"] <= 0.95 * memory_gib * GIB  # headroom left for graphs, allocator


def test_nothing_left_for_the_cache_is_zero_not_negative():
    assert mp.kv_cache_bytes(GIB, 2 * GIB) == 0


def test_the_largest_step_is_built_through_a_running_batch(tmp_path):
    build_tiny_model("llama", tmp_path)
    config = EngineConfig(block_size=4, kv_cache_bytes=1 << 20, dtype="float32", max_num_batched_tokens=300)
    runner = ModelRunner(str(tmp_path), config)  # the tiny model's context: 256 tokens
    inputs, scratch, lengths = runner._largest_step()
    assert lengths == [256, 44]
    assert inputs.input_ids.shape[0] == 300 and inputs.num_rows == 2
    assert len(inputs.logits_indices) == 300 - 2  # every row but each sequence's last is scored
    assert scratch.num_blocks == 64 + 11
    assert inputs.metadata.block_tables.tolist()[1][:11] == list(range(64, 75))
