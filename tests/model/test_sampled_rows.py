"""A prompt step's last layer computes its sampled rows alone (AttentionMetadata.sampled): every row's
K/V still reach the cache, and the sampled rows' final hidden states are the same bits as when the
last layer computes every row, in fp32 and bf16, on the native and the reference kernels, for the
Llama, Gemma and mixture-of-experts layers."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.models import VOCAB, build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scoring import ScoringState
from bulkrun.engine.worker.runner import ModelRunner
from bulkrun.engine.worker.step_inputs import build_step_inputs
from bulkrun_kernels import cpu_build, cpu_dtype
from bulkrun_kernels.reference import plan_attention

BLOCK = 4


def _work() -> list[tuple[Request, int, bool]]:
    """Three prompts: two whole (they sample), one's first chunk (it does not)."""
    gen = torch.Generator().manual_seed(5)
    rows = []
    for i, (n, length) in enumerate(((9, 9), (11, 20), (4, 4))):
        r = Request(
            f"r{i}", SamplingParams(), torch.randint(3, VOCAB, (length,), generator=gen).tolist(), length
        )
        r.block_table = list(range(6 * i, 6 * i + 6))
        rows.append((r, n, n == length))
    return rows


def _final_hidden(runner: ModelRunner, trim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = build_step_inputs(_work(), BLOCK)
    md = inputs.metadata
    assert md.sampled is not None and md.sampled.rows.tolist() == inputs.logits_indices.tolist() == [8, 23]
    if not trim:
        md = dataclasses.replace(md, sampled=None)
    if runner.ops.backend == "reference":
        md.plan = plan_attention(md.block_tables, md.query_start_loc, md.seq_lens, BLOCK, runner.dtype)
    runner.kv_cache.data.zero_()
    with torch.inference_mode():
        h = runner.model.final_hidden(inputs.input_ids, md, runner.kv_cache.layers, inputs.logits_indices)
    return h, runner.kv_cache.data.clone()


@pytest.mark.parametrize("kind", ["llama", "gemma3", "qwen3_moe"])
@pytest.mark.parametrize(
    ("kernels", "dtype"), [("cpu", "float32"), ("cpu", "bfloat16"), ("reference", "float32")]
)
def test_sampled_rows_alone_in_the_last_layer_give_the_same_bits(kind, kernels, dtype, tmp_path):
    if kernels == "cpu" and not cpu_build.load():
        pytest.skip(f"CPU native kernels unavailable: {cpu_build.load_error()}")
    if dtype == "bfloat16" and not cpu_dtype.native_bf16():
        pytest.skip("needs native bf16 dot products")
    build_tiny_model(kind, tmp_path)
    runner = ModelRunner(str(tmp_path), EngineConfig(block_size=BLOCK, kv_cache_bytes=1 << 20, dtype=dtype,
                                                     kernels=kernels))  # fmt: skip
    trimmed, trimmed_cache = _final_hidden(runner, trim=True)
    full, full_cache = _final_hidden(runner, trim=False)
    assert trimmed.shape == full.shape == (2, runner.model.cfg.hidden_size)
    assert torch.equal(trimmed, full)
    assert torch.equal(trimmed_cache, full_cache)  # every row's K/V, in every layer


def test_a_step_whose_rows_all_sample_or_that_scores_keeps_every_row():
    gen = torch.Generator().manual_seed(6)
    decode = Request("d", SamplingParams(), torch.randint(3, VOCAB, (5,), generator=gen).tolist(), 5)
    decode.block_table, decode.num_computed_tokens = [0, 1], 4
    prompt = Request("p", SamplingParams(), torch.randint(3, VOCAB, (6,), generator=gen).tolist(), 6)
    prompt.block_table = [2, 3]
    assert build_step_inputs([(decode, 1, True), (prompt, 6, True)], BLOCK).metadata.sampled is not None
    assert build_step_inputs([(decode, 1, True)], BLOCK).metadata.sampled is None  # nothing to spare
    assert build_step_inputs([(prompt, 3, False)], BLOCK).metadata.sampled is None  # no row samples
    prompt.scoring = ScoringState(score_start=1)  # logits at every prompt row: each row is read
    assert build_step_inputs([(decode, 1, True), (prompt, 6, True)], BLOCK).metadata.sampled is None
