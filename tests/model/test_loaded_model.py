"""The last loaded model serves every later runner of this process with the same directory, device,
dtype and kernels (a notebook's next job); other settings or rewritten files load their own, and
runners on a reused model compute what runners on a fresh load compute."""

from __future__ import annotations

import os

import pytest
from helpers.models import build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scheduler import SchedulerOutput
from bulkrun.engine.worker import loaded_model
from bulkrun.engine.worker.runner import ModelRunner


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(loaded_model, "_LAST", {})
    build_tiny_model("llama_untied", tmp_path)
    return str(tmp_path)


def test_the_last_model_serves_runners_of_the_same_settings_only(folder):
    fp32 = EngineConfig(dtype="float32", kv_cache_bytes=1 << 20)
    first = loaded_model.load(folder, fp32)
    assert loaded_model.load(folder, fp32) is first
    assert (
        ModelRunner(folder, EngineConfig(dtype="float32", kv_cache_bytes=1 << 19, block_size=8)).model
        is first.model
    )
    assert loaded_model.load(folder, EngineConfig(dtype="bfloat16")) is not first
    assert loaded_model.load(folder, fp32) is not first  # one model at a time: bf16 replaced it
    again = loaded_model.load(folder, fp32)
    assert loaded_model.load(folder, EngineConfig(dtype="float32", kernels="reference")) is not again
    again = loaded_model.load(folder, fp32)
    weights = os.path.join(folder, "model.safetensors")
    os.utime(weights, ns=(os.stat(weights).st_atime_ns, os.stat(weights).st_mtime_ns + 10**9))
    assert loaded_model.load(folder, fp32) is not again  # rewritten weights are loaded again


def test_runners_on_a_reused_model_compute_what_a_fresh_load_computes(folder):
    config = EngineConfig(dtype="float32", kv_cache_bytes=1 << 20, block_size=4)
    shared = [ModelRunner(folder, config) for _ in range(2)]
    assert shared[0].model is shared[1].model
    loaded_model.forget()
    alone = ModelRunner(folder, config)
    assert alone.model is not shared[0].model
    tokens = [3, 9, 27, 17, 5, 7]

    def step(runner):
        request = Request("a", SamplingParams(max_tokens=1, logprobs=True), tokens, len(tokens))
        request.block_table = [0, 1]
        out = runner.execute(SchedulerOutput([(request, len(tokens), True)]))
        return out.sampled["a"], out.sampled_logprobs["a"]

    want = step(alone)
    assert [step(r) for r in shared] == [want, want]
