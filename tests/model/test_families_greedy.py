"""Every family beyond Llama, run by the whole engine: greedy continuations of 64 tokens equal
transformers' fp32 `generate` token for token, for prompts of mixed lengths (most longer than the
sliding window), arriving in chunks (a small token budget), some sharing a prefix (prefix-cache
hits), on the reference and on the CPU native kernels."""

from __future__ import annotations

import pytest
import torch
from helpers.models import VOCAB, build_tiny_model, hf_greedy

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun_kernels import cpu_build

NEW_TOKENS = 64
# phi3_longrope / phi4_mini: LongRoPE over a short context of 32: prompts on both sides of it, and
# generation that crosses it (transformers' Phi-3 then recomputes every position on the long factors)
FAMILIES = [
    "gemma2",
    "gemma3",
    "qwen3_moe",
    "qwen2_moe",
    "mixtral",
    "phi3",
    "phi3_longrope",
    "phi4_mini",
    "gpt_oss",
]


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    rand = lambda n: torch.randint(3, VOCAB, (n,), generator=gen).tolist()  # noqa: E731
    shared = rand(40)  # 2.5 blocks of 16: a prefix hit for the later sharers
    return [rand(3), rand(29), shared + rand(5), rand(12), shared + rand(9), rand(70), shared + rand(2), [5]]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = build_tiny_model(request.param, folder, eos_token_id=None)  # no early stop: all 64 compared
    expected = hf_greedy(hf, _prompts(), NEW_TOKENS)
    return folder, expected


@pytest.mark.parametrize("kernels", ["reference", "cpu"])
def test_greedy_equals_transformers_with_chunks_and_prefix_hits(family, kernels):
    folder, expected = family
    if kernels == "cpu" and not cpu_build.load():
        pytest.skip(f"CPU native kernels unavailable: {cpu_build.load_error()}")
    config = EngineConfig(dtype="float32", kernels=kernels, max_num_batched_tokens=24, max_num_seqs=4,
                          kv_cache_bytes=8 << 20)  # fmt: skip
    engine = load_engine(str(folder), config)
    requests = [EngineRequest(f"p{i}", ids, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
                for i, ids in enumerate(_prompts())]  # fmt: skip
    steps = []
    outputs = sorted(engine.stream(requests, on_step=steps.append), key=lambda o: int(o.request_id[1:]))
    assert [o.output_token_ids for o in outputs] == expected
    assert sum(s.prefix_cache_hit_tokens for s in steps) >= 32
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in steps)  # chunks among decodes
    moe = engine.runner.model.cfg.moe
    routed = sum(sum(s.expert_tokens) for s in steps if s.expert_tokens is not None)
    if moe is None:
        assert routed == 0
    else:  # every computed token went to top_k experts in every sparse layer, and the stats say so;
        # the last layer computes a prompt step's sampled rows alone where some rows do not sample
        *body, last = moe.sparse_layers

        def last_rows(s) -> int:
            sampled = s.num_generated_tokens
            return sampled if 0 < sampled < s.num_scheduled_tokens else s.num_scheduled_tokens

        computed = sum(s.num_scheduled_tokens * sum(body) + last_rows(s) * last for s in steps)
        assert any(last_rows(s) < s.num_scheduled_tokens for s in steps)
        assert routed == computed * moe.top_k
