"""A bf16 model on the CPU: the native kernels run it end to end (bf16 layers and KV cache, fp32
embedding, LM head and rotary table), its logits stay close to the fp32 model's, the screened greedy
head answers exactly as its full head; and a CPU without native bf16 runs in fp32, saying so once."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.models import VOCAB, build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scheduler import SchedulerOutput
from bulkrun.engine.worker import loaded_model as loaded_model_module
from bulkrun.engine.worker.runner import ModelRunner
from bulkrun_kernels import cpu_build, cpu_dtype

BLOCK = 4
needs_native = pytest.mark.skipif(
    not cpu_build.compiler_available() or not cpu_dtype.native_bf16(),
    reason="needs the CPU native kernels and native bf16 dot products",
)


@pytest.fixture(scope="module", params=["llama", "llama_untied", "qwen3"])
def runners(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    build_tiny_model(request.param, folder)
    make = lambda dtype: ModelRunner(  # noqa: E731
        str(folder), EngineConfig(block_size=BLOCK, kv_cache_bytes=1 << 20, dtype=dtype)
    )
    return make("float32"), make("bfloat16")


def _step(logprobs: bool) -> SchedulerOutput:
    gen = torch.Generator().manual_seed(3)
    scheduled = []
    for i, n in enumerate((9, 5, 12, 1)):
        prompt = torch.randint(3, VOCAB, (n,), generator=gen).tolist()
        r = Request(f"r{i}", SamplingParams(logprobs=logprobs), prompt, n)
        r.block_table = list(range(4 * i, 4 * i + 4))
        scheduled.append((r, n, True))
    return SchedulerOutput(scheduled)


@needs_native
def test_bf16_model_runs_natively_with_fp32_head_and_cache_in_bf16(runners):
    _, bf16 = runners
    model = bf16.model
    assert bf16.ops.backend == "cpu" and bf16.kv_cache.data.dtype == torch.bfloat16
    assert model.layers[0].attn.qkv.dtype == torch.bfloat16 and model.norm.dtype == torch.bfloat16
    assert model.lm_head.dtype == torch.float32 and model.embed_tokens.dtype == torch.float32
    assert model.cos_sin_cache.dtype == torch.float32
    assert model.residual_dtype == torch.float32  # the residual stream is summed and kept in fp32
    assert bf16.greedy_head is not None


@needs_native
def test_bf16_logprobs_track_fp32(runners):
    fp32, bf16 = runners
    want = fp32.execute(_step(logprobs=True)).sampled_logprobs
    got = bf16.execute(_step(logprobs=True)).sampled_logprobs
    assert got.keys() == want.keys()
    for rid in want:
        assert got[rid] == pytest.approx(want[rid], abs=0.1)


@needs_native
def test_bf16_screened_greedy_equals_its_full_head(runners, monkeypatch):
    _, bf16 = runners
    screened = bf16.execute(_step(logprobs=False)).sampled
    monkeypatch.setattr(bf16, "greedy_head", None)
    assert bf16.execute(_step(logprobs=False)).sampled == screened


def test_without_native_bf16_the_default_is_fp32_said_once(monkeypatch, caplog):
    monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    monkeypatch.setattr(cpu_dtype, "_said", set())
    with caplog.at_level(logging.INFO, logger="bulkrun.kernels"):
        assert cpu_dtype.default_cpu_dtype() == torch.float32
        assert cpu_dtype.default_cpu_dtype() == torch.float32
    lines = [r.getMessage() for r in caplog.records if "bf16" in r.getMessage()]
    assert len(lines) == 1 and "float32" in lines[0]


def test_with_native_bf16_the_default_is_bf16(monkeypatch):
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN has no bf16 on this CPU")
    monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert cpu_dtype.default_cpu_dtype() == torch.bfloat16


def test_the_runner_says_which_dtype_it_chose_and_why(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(loaded_model_module, "default_cpu_dtype", lambda: torch.bfloat16)
    assert loaded_model_module.resolve_device_dtype(EngineConfig(device="cpu"), "cpu")[1:] == (
        torch.bfloat16,
        "the CPU default: native bf16 dot products and the native kernels",
    )
    device, dtype, why = loaded_model_module.resolve_device_dtype(EngineConfig(device="cpu"), "reference")
    assert (device, dtype) == (cpu, torch.float32) and "reference" in why  # bf16 would be emulated
    asked = EngineConfig(device="cpu", dtype="float32")
    assert loaded_model_module.resolve_device_dtype(asked, "cpu")[1:] == (torch.float32, "asked for")
    monkeypatch.setattr(loaded_model_module, "default_cpu_dtype", lambda: torch.float32)
    assert "no native bf16" in loaded_model_module.resolve_device_dtype(EngineConfig(device="cpu"), "cpu")[2]
    with pytest.raises(ValueError, match="dtype must be one of"):
        loaded_model_module.resolve_device_dtype(EngineConfig(device="cpu", dtype="fp8"), "cpu")
