"""A request's tokens and log-probabilities are the same bits alone, in batches of other sizes and
compositions, under other token budgets (other prompt chunks), after a preemption and after a
prefix-cache hit (whole blocks, blocks another row of the step fills, and a block's leading tokens
copied): bf16 and fp32, the native CPU kernels and the reference."""

from __future__ import annotations

import pytest
import torch
from helpers.models import VOCAB, build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun.engine.worker.kv_cache import bytes_per_block
from bulkrun.model.config import ModelConfig

NEW_TOKENS = 12
_INVARIANCE: dict = {}  # test_the_check_has_power sets batch_invariant=False
# head_dim 32 and K a multiple of 32: the AMX paths (linears, attention) take part
SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("invariance-model")
    build_tiny_model("llama", folder, **SHAPE)
    return str(folder)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(3, VOCAB, (40,), generator=g).tolist()  # a prefix the cache can serve
    lengths = [1, 2, 5, 17, 33, 70, 9, 48]
    own = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
    return [shared + p if i % 2 else p for i, p in enumerate(own)]


CACHED: dict[str, list[int]] = {}  # the last _run's prompt tokens served from the cache, by request


def _run(model_dir, prompts, order=None, **config) -> dict[int, tuple[list[int], list[float]]]:
    engine = load_engine(model_dir, EngineConfig(kv_cache_bytes=config.pop("kv", 8 << 20), **config))
    order = order or list(range(len(prompts)))
    requests = [
        EngineRequest(
            str(i), prompts[i], SamplingParams(max_tokens=NEW_TOKENS, logprobs=i % 3 != 2, ignore_eos=True)
        )
        for i in order
    ]
    outputs = engine.generate(requests)
    CACHED["last"] = [o.num_cached_tokens for o in outputs]
    out = {int(o.request_id): (o.output_token_ids, o.logprobs or []) for o in outputs}
    assert all(len(t) == NEW_TOKENS for t, _ in out.values())
    return out


@pytest.mark.parametrize(
    ("dtype", "kernels"),
    [
        ("bfloat16", "cpu"),
        ("float32", "cpu"),
        ("bfloat16", "reference"),
        ("float32", "reference"),
    ],
)
def test_same_bits_in_any_batch(model_dir, dtype, kernels):
    prompts = _prompts()
    base = {"dtype": dtype, "kernels": kernels, "device": "cpu", **_INVARIANCE}
    alone = {}
    for i in range(len(prompts)):  # each request alone, its prompt in one chunk, no cache
        alone.update(_run(model_dir, prompts, [i], enable_prefix_caching=False, **base))
    runs = {"all together": _run(model_dir, prompts, **base)}
    # admitted in one step, the later sharers take the first one's prefix blocks as it fills them
    assert CACHED["last"].count(32) == 3
    runs["reversed, 3 at a time"] = _run(
        model_dir, prompts, order=list(range(8))[::-1], max_num_seqs=3, **base
    )
    # the later sharers take the 40-token prefix from the cache: 2 blocks and 8 tokens copied
    assert 40 in CACHED["last"]
    runs |= {
        "16-token chunks": _run(model_dir, prompts, max_num_batched_tokens=16, **base),
        "7-token chunks, no cache": _run(
            model_dir, prompts, max_num_batched_tokens=7, enable_prefix_caching=False, **base
        ),
    }
    cfg = ModelConfig.from_model_dir(model_dir)
    per_block = bytes_per_block(cfg, 16, getattr(torch, dtype))
    preempted = _run(model_dir, prompts, kv=12 * per_block, **base)
    runs["preempted"] = preempted
    for name, got in runs.items():
        for i, want in alone.items():
            assert got[i] == want, f"{name}: request {i} differs from its run alone"


def test_the_check_has_power(model_dir, monkeypatch):
    """Without batch invariance the same comparison fails: the test above can fail. In fp32, whose
    bits no bf16 rounding hides: the linears switch kernels with the row count and a prompt chunk's
    attention rows take the many-row path on every CPU (bf16 attention computes a row alike in any
    tile, with or without invariance)."""
    monkeypatch.setitem(_INVARIANCE, "batch_invariant", False)
    with pytest.raises(AssertionError, match="differs from its run alone"):
        test_same_bits_in_any_batch(model_dir, "float32", "cpu")
