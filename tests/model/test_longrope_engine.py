"""LongRoPE through the whole engine, where the short and the long factors meet: a short prompt that
shares its first blocks with long prompts (the two kinds of KV must not serve each other), a KV
cache small enough to preempt, async scheduling (a token in flight at the switch), and the padded
static buffers of captured decode steps (run eagerly). Greedy fp32 continuations equal transformers'
`generate` token for token."""

from __future__ import annotations

import pytest
import torch
from helpers.models import VOCAB, build_tiny_model, hf_greedy

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.worker.decode_graphs import DecodeGraphs
from bulkrun.engine.worker.runner import ModelRunner
from bulkrun_kernels import cpu_build

NEW_TOKENS = 40
BLOCK_BYTES = 2 * 2 * 2 * 16 * 16 * 4  # layers x (k, v) x kv heads x head_dim x block of 16 x fp32


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    rand = lambda n: torch.randint(3, VOCAB, (n,), generator=gen).tolist()  # noqa: E731
    shared = rand(36)  # past the short context of 32
    # long sharers first, then short prompts with the same first 16 / 32 tokens
    return [shared + rand(4), shared + rand(7), shared[:20], rand(30), shared[:32], rand(33)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("phi4_mini")
    hf = build_tiny_model("phi4_mini", folder, eos_token_id=None)
    expected = hf_greedy(hf, _prompts(), NEW_TOKENS)
    return str(folder), expected


def _generate(folder, kernels, graphs=False, **config):
    config = EngineConfig(dtype="float32", kernels=kernels, max_num_seqs=4, cuda_graphs=False, **config)
    runner = ModelRunner(folder, config)
    if graphs:  # the captured steps' static buffers, not captured: they run eagerly
        runner.graphs = DecodeGraphs(runner, [1, 2, 4])
    engine = Engine(runner, config)
    requests = [EngineRequest(f"p{i}", ids, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
                for i, ids in enumerate(_prompts())]  # fmt: skip
    steps = []
    outputs = sorted(engine.stream(requests, on_step=steps.append), key=lambda o: int(o.request_id[1:]))
    return [o.output_token_ids for o in outputs], steps


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_short_and_long_prompts_sharing_blocks(model, kernels):
    folder, expected = model
    if kernels == "cpu" and not cpu_build.load():
        pytest.skip(f"CPU native kernels unavailable: {cpu_build.load_error()}")
    got, steps = _generate(folder, kernels, max_num_batched_tokens=24, kv_cache_bytes=64 * BLOCK_BYTES)
    assert got == expected
    assert sum(s.prefix_cache_hit_tokens for s in steps) >= 32


def test_preempted_and_asynchronous_with_padded_decode_steps(model):
    folder, expected = model
    got, steps = _generate(folder, "reference", graphs=True, async_scheduling=True, max_num_batched_tokens=32,
                           kv_cache_bytes=13 * BLOCK_BYTES)  # fmt: skip
    assert got == expected
    assert sum(s.num_preempted for s in steps) > 0  # the cache really was too small
