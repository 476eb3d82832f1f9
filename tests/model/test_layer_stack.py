"""The middle decoder layers in one native call (bulkrun/model/layer_stack.py) give the bits the layers
give one by one, in the final hidden states and in every layer's K/V, on prompt and decode steps,
batch invariant or not; layers that are not exactly its recipe run one by one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.models import VOCAB, _longrope, build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.worker import loaded_model
from bulkrun.engine.worker.runner import ModelRunner
from bulkrun.engine.worker.step_inputs import build_step_inputs
from bulkrun.model.decoder import DecoderLM
from bulkrun_kernels import cpu_build, cpu_dtype
from bulkrun_kernels.cpu_gemm import fixed_order_bf16_kernel, gated_gemm_available, qkv_gemm_available

BLOCK = 4

pytestmark = pytest.mark.skipif(
    not (cpu_build.load() and cpu_dtype.native_bf16() and fixed_order_bf16_kernel()),
    reason="needs the native kernels and a fixed-order bf16 GEMM (AVX512-BF16 or AMX)",
)


def _runner(kind: str, folder, invariant: bool = True, **config) -> ModelRunner:
    build_tiny_model(kind, folder, num_hidden_layers=5, **config)
    engine_config = EngineConfig(block_size=BLOCK, kv_cache_bytes=1 << 20, dtype="bfloat16", kernels="cpu",
                                 batch_invariant=invariant)  # fmt: skip
    return ModelRunner(str(folder), engine_config)


def _work(decode: bool) -> list[tuple[Request, int, bool]]:
    """Three sequences: whole prompts, or one new token each after their prompts."""
    gen = torch.Generator().manual_seed(7)
    rows = []
    for i, length in enumerate((9, 17, 5)):
        r = Request(
            f"r{i}", SamplingParams(), torch.randint(3, VOCAB, (length,), generator=gen).tolist(), length
        )
        r.block_table = list(range(6 * i, 6 * i + 6))
        if decode:
            r.num_computed_tokens = length - 1
        rows.append((r, 1 if decode else length, True))
    return rows


def _final_hidden(runner: ModelRunner, stacked: bool, decode: bool) -> tuple[torch.Tensor, torch.Tensor]:
    model = runner.model
    saved = model._middle_stack()
    model._stack = saved if stacked else None
    try:
        runner.kv_cache.data.zero_()
        with torch.inference_mode():
            if decode:  # the prompts' K/V first, as the steps before would have written them
                inputs = build_step_inputs(_work(decode=False), BLOCK)
                model.final_hidden(
                    inputs.input_ids, inputs.metadata, runner.kv_cache.layers, inputs.logits_indices
                )
            inputs = build_step_inputs(_work(decode), BLOCK)
            h = model.final_hidden(
                inputs.input_ids, inputs.metadata, runner.kv_cache.layers, inputs.logits_indices
            )
        return h, runner.kv_cache.data.clone()
    finally:
        model._stack = saved


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: q/k/v biases
@pytest.mark.parametrize("invariant", [True, False])
@pytest.mark.parametrize("decode", [False, True])
def test_the_native_stack_gives_the_layer_by_layer_bits(kind, invariant, decode, tmp_path):
    runner = _runner(kind, tmp_path, invariant)
    stack = runner.model._middle_stack()
    assert stack is not None and len(stack.weights) == 4 * 3  # layers 1, 2, 3 of 0 .. 4
    stacked, stacked_cache = _final_hidden(runner, stacked=True, decode=decode)
    alone, alone_cache = _final_hidden(runner, stacked=False, decode=decode)
    assert torch.equal(stacked, alone)
    assert torch.equal(stacked_cache, alone_cache)
    assert stacked_cache.abs().sum() > 0  # the layers wrote their K/V


def test_the_native_stack_runs_in_a_step(tmp_path, monkeypatch):
    runner = _runner("llama", tmp_path)
    calls = []
    native = runner.ops.decoder_layers
    counted = dataclasses.replace(
        runner.ops, decoder_layers=lambda *a, **k: calls.append(1) or native(*a, **k)
    )
    monkeypatch.setattr(runner.model, "ops", counted)
    _final_hidden(runner, stacked=True, decode=True)
    assert calls == [1, 1]  # the prompt step, then the decode step


def test_layers_off_the_recipe_run_one_by_one(tmp_path):
    """q/k norms (Qwen3), a sliding window, a soft-cap: not what the native call computes."""
    assert _runner("qwen3", tmp_path / "qwen3").model._middle_stack() is None
    for knob, value in (("window", 4), ("softcap", 30.0)):
        model = _runner("llama", tmp_path / knob).model
        setattr(model.layers[2].attn, knob, value)
        assert model._middle_stack() is None


def test_a_step_of_many_rows_not_batch_invariant_runs_one_by_one(tmp_path):
    """Not invariant, a prompt step's linears run on oneDNN (Linear.on_tiles): the stack stands aside."""
    stack = _runner("llama", tmp_path, invariant=False).model._middle_stack()
    assert stack.runs(8) and not stack.runs(4096)


# heads of 32 dims: the rotary q/k/v GEMM needs head_dim a multiple of 32 (the tiny models' is 16)
HEADS32 = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}


# llama, qwen2 (q/k/v biases): the native stack's recipe; the others, their layers one by one:
# windows, LongRoPE's rows, a partial rotary (phi4_mini: not fused), GeGLU with soft-caps (gemma2),
# experts, sinks
FUSED_KINDS = [
    "llama",
    "qwen2",
    "mistral",
    "phi3",
    "phi3_longrope",
    "phi4_mini",
    "gemma2",
    "mixtral",
    "gpt_oss",
]


@pytest.mark.skipif(
    not (gated_gemm_available() and qkv_gemm_available()), reason="the fused GEMMs run on AMX tiles only"
)
@pytest.mark.parametrize("kind", FUSED_KINDS)
@pytest.mark.parametrize("decode", [False, True])
def test_fused_gemms_give_the_unfused_bits(kind, decode, tmp_path, monkeypatch):
    """On AMX q/k/v runs as amx_gemm_qkv (rotary and the KV write in its epilogue) and gate_up as
    amx_gemm_gated, in the native stack and in the layers one by one alike: the bits of the plain
    GEMMs, then the ops."""
    config = {**HEADS32, "head_dim": 32}
    if kind == "phi3_longrope":  # its factors: one per rotated dim pair
        config["rope_parameters"] = _longrope(16)
    if kind == "phi4_mini":
        config["rope_parameters"] = _longrope(12, attention_factor=1.1)
    fused = _runner(kind, tmp_path / "fused", **config)
    if kind in ("llama", "qwen2"):
        assert all(layer.mlp.gate_up.gated == "silu" for layer in fused.model.layers)
        assert all(layer.attn.qkv.rotary_heads == (2, 1, 32) for layer in fused.model.layers)
        stack = fused.model._middle_stack()
        assert stack.gate_up_gated and stack.qkv_rotary
    if kind == "phi4_mini":  # its rotary covers 3/4 of each head
        assert all(layer.attn.qkv.rotary_heads is None for layer in fused.model.layers)
    monkeypatch.setattr(loaded_model, "fuse_gated_mlps", lambda model: 0)
    monkeypatch.setattr(DecoderLM, "fuse_qkv_rotary", lambda model: 0)
    plain = _runner(kind, tmp_path / "plain", **config)
    assert all(getattr(m, "rotary_heads", None) is None for m in plain.model.modules())
    for stacked in (True, False):
        h, cache = _final_hidden(fused, stacked, decode)
        h_plain, cache_plain = _final_hidden(plain, stacked, decode)
        assert torch.equal(h, h_plain) and torch.equal(cache, cache_plain), stacked
        assert cache.abs().sum() > 0
