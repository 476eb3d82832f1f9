"""A model kept resident (as the `bulkrun daemon` keeps one) serves every runner with the same
directory, device, dtype and kernels; other settings load their own, and runners on the resident
model compute what runners on their own loads compute."""

from __future__ import annotations

import pytest
from helpers.models import build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.core.request import Request
from bulkrun.engine.core.scheduler import ScheduledRequest, SchedulerOutput
from bulkrun.engine.worker import loaded_model
from bulkrun.engine.worker.runner import ModelRunner


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(loaded_model, "_RESIDENT", {})
    build_tiny_model("llama_untied", tmp_path)
    return str(tmp_path)


def test_a_resident_model_serves_runners_of_the_same_settings_only(folder):
    fp32 = EngineConfig(dtype="float32", kv_cache_bytes=1 << 20)
    resident = loaded_model.keep_resident(folder, fp32)
    assert loaded_model.load(folder, fp32) is resident
    assert (
        ModelRunner(folder, EngineConfig(dtype="float32", kv_cache_bytes=1 << 19, block_size=8)).model
        is resident.model
    )
    assert loaded_model.load(folder, EngineConfig(dtype="bfloat16")) is not resident
    assert loaded_model.load(folder, EngineConfig(dtype="float32", kernels="reference")) is not resident


def test_runners_on_the_resident_model_compute_what_their_own_loads_compute(folder):
    config = EngineConfig(dtype="float32", kv_cache_bytes=1 << 20, block_size=4)
    alone = ModelRunner(folder, config)
    loaded_model.keep_resident(folder, config)
    shared = [ModelRunner(folder, config) for _ in range(2)]
    tokens = [3, 9, 27, 17, 5, 7]

    def step(runner):
        request = Request("a", SamplingParams(max_tokens=1, logprobs=True), tokens, len(tokens), arrival=0)
        request.block_table = [0, 1]
        out = runner.execute(SchedulerOutput(scheduled=[ScheduledRequest(request, len(tokens), True)]))
        return out.sampled["a"], out.sampled_logprobs["a"]

    want = step(alone)
    assert [step(r) for r in shared] == [want, want]
