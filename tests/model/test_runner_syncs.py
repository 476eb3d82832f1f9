"""No host synchronisation inside ModelRunner.launch(): greedy, logprob, sampled (top-p, top-k, min-p),
constrained and scoring steps, prompt chunks and steady decode steps with their inputs in flight
(async scheduling), each run under SyncRecorder (tests/model/sync_recorder.py), which records on the
CPU every operation that would make a GPU host wait. The runner is set up as on a GPU: no screened
greedy head (CPU-only), top-p rows sorting their whole vocabulary. Its model forward is trusted here:
on a GPU its kernels run under torch.cuda.set_sync_debug_mode("error") before capture."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest
import torch
from helpers.models import VOCAB, build_tiny_model
from sync_recorder import SyncRecorder

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.core.params import EngineRequest, PoolingParams, SamplingParams
from bulkrun.engine.structured_output.step_masks import StepMasks
from bulkrun.engine.worker.runner import ModelRunner
from bulkrun.engine.worker.sampler import Sampler


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    build_tiny_model("llama", folder)
    return str(folder)


@pytest.fixture
def engine(model_dir, monkeypatch):
    config = EngineConfig(
        block_size=4, kv_cache_bytes=1 << 20, dtype="float32", kernels="cpu", max_num_seqs=8,
        async_scheduling=True, enable_prefix_caching=False,
    )  # fmt: skip
    runner = ModelRunner(model_dir, config)
    runner.greedy_head = None  # as on a GPU
    runner.sampler = Sampler(staging=runner.staging, widen_on_host=False)
    recorder = SyncRecorder()
    recorder.instrument(runner, monkeypatch)
    launch = runner.launch
    steps = []

    def recorded_launch(sched):
        before = len(recorder.syncs)
        with recorder.active():
            handle = launch(sched)
        steps.append((sched.num_scheduled_tokens == len(sched.requests), recorder.syncs[before:]))
        return handle

    monkeypatch.setattr(runner, "launch", recorded_launch)
    engine = Engine(runner, config)
    engine.steps, engine.recorder = steps, recorder
    return engine


def _prompt(i: int, n: int) -> list[int]:
    return [3 + (5 * i + 7 * j) % (VOCAB - 3) for j in range(n)]


def _requests(params: list[SamplingParams]) -> list[EngineRequest]:
    return [EngineRequest(f"r{i}", _prompt(i, 3 + 4 * i), p) for i, p in enumerate(params)]


KINDS = {
    "greedy": [SamplingParams(max_tokens=7, ignore_eos=True)] * 4,
    "greedy-logprobs": [SamplingParams(max_tokens=7, ignore_eos=True, logprobs=i % 2 == 0) for i in range(4)],
    "sampled": [
        SamplingParams(max_tokens=7, ignore_eos=True, temperature=0.8, top_p=0.9, seed=1),
        SamplingParams(max_tokens=7, ignore_eos=True, temperature=1.2, top_k=5, seed=2),
        SamplingParams(max_tokens=7, ignore_eos=True, temperature=0.7, top_k=8, top_p=0.5, min_p=0.1, seed=3),
        SamplingParams(max_tokens=7, ignore_eos=True, logprobs=True),  # a greedy row beside them
    ],
}


def _steps_checked(engine) -> list:
    decode = [syncs for decode_only, syncs in engine.steps if decode_only]
    assert len(decode) >= 3, "the workload reached no steady decode steps"
    return [syncs for _, syncs in engine.steps]


@pytest.mark.parametrize("kind", list(KINDS))
def test_steps_launch_without_a_host_sync(engine, kind):
    outputs = engine.generate(_requests(KINDS[kind]))
    assert all(len(o.output_token_ids) == 7 for o in outputs)
    assert _steps_checked(engine) == [[]] * len(engine.steps)


def test_decode_steps_took_their_inputs_from_the_previous_step_on_the_device(engine, monkeypatch):
    runner, placed = engine.runner, []
    place = runner._place_pending_inputs
    monkeypatch.setattr(
        runner,
        "_place_pending_inputs",
        lambda inputs: (placed.append(len(inputs.pending_at)), place(inputs))[1],
    )
    engine.generate(_requests(KINDS["greedy"]))
    assert max(placed) == 4  # async scheduling: the whole batch's inputs were still in flight
    assert _steps_checked(engine) == [[]] * len(engine.steps)


def test_constrained_steps_launch_without_a_host_sync(engine, monkeypatch):
    """Requests r0 (greedy) and r2 (sampled) are constrained to tokens 3..19 (a mask as the grammar
    filler leaves it); the masks cross to the device with their rows."""
    runner = engine.runner
    allowed = np.zeros((1, (VOCAB + 31) // 32), np.int32)
    for t in range(3, 20):
        allowed[0, t // 32] |= np.int32(1 << (t % 32)) if t % 32 < 31 else np.int32(-(1 << 31))

    def start(requests):
        rows = [i for i, r in enumerate(requests) if r.request_id in ("r0", "r2")]
        if not rows:
            return None
        done = Future()
        done.set_result(None)
        return StepMasks(rows, [None] * len(rows), np.repeat(allowed, len(rows), axis=0), done)

    monkeypatch.setattr(runner.grammar_masks, "start", start)
    monkeypatch.setitem(engine.constrained.live, "held", None)  # the engine then asks for masks
    params = [
        SamplingParams(max_tokens=7, ignore_eos=True, temperature=t, seed=4) for t in (0.0, 0.0, 1.0, 1.0)
    ]
    outputs = engine.generate(_requests(params))
    assert all(3 <= t < 20 for t in outputs[0].output_token_ids + outputs[2].output_token_ids)
    assert _steps_checked(engine) == [[]] * len(engine.steps)


def test_scoring_steps_launch_without_a_host_sync(engine):
    requests = [
        EngineRequest("s0", _prompt(0, 9), continuations=[[5, 6, 7], [8]]),
        EngineRequest("s1", _prompt(1, 14), continuations=[[9, 10], [11, 12, 13, 14]]),
        *_requests(KINDS["greedy"][:3]),  # scoring rows beside decode rows
    ]
    outputs = {o.request_id: o for o in engine.generate(requests)}
    assert [len(c) for c in outputs["s1"].continuation_logprobs] == [2, 4]
    assert _steps_checked(engine) == [[]] * len(engine.steps)


def test_pooling_steps_launch_without_a_host_sync(engine):
    """Decoder embedders (last-token pooling), with mixed settings beside decode rows: the vectors
    stay on the device until the step's result()."""
    pools = [PoolingParams("last", normalize=True), PoolingParams("last", dimensions=8)]
    requests = [
        *(EngineRequest(f"p{i}", _prompt(i, 6 + 5 * i), pooling=p) for i, p in enumerate(pools)),
        EngineRequest("p2", _prompt(2, 9), pooling=pools[0]),
        *_requests(KINDS["greedy"][:2]),
    ]
    outputs = {o.request_id: o for o in engine.generate(requests)}
    assert outputs["p0"].embedding.shape == (64,) and outputs["p1"].embedding.shape == (8,)
    assert abs(float((outputs["p0"].embedding ** 2).sum()) - 1) < 1e-5
    assert _steps_checked(engine) == [[]] * len(engine.steps)


@pytest.mark.parametrize(
    "sync",
    [
        lambda tokens: tokens.tolist(),
        lambda tokens: tokens[0].item(),
        lambda tokens: tokens[tokens > 4],
        lambda tokens: tokens[torch.tensor([0, 1])],
        lambda tokens: tokens.index_select(0, torch.tensor([0, 1], device=tokens.device)),
        lambda tokens: torch.from_numpy(np.zeros(len(tokens), np.int64)).copy_(tokens),
        lambda tokens: tokens.to("cpu"),
        lambda tokens: tokens.nonzero(),
    ],
    ids=[
        "tolist",
        "item",
        "bool-mask",
        "host-index",
        "tensor-on-device",
        "copy-to-host",
        "to-cpu",
        "nonzero",
    ],
)
def test_the_recorder_catches_a_deliberate_sync(engine, monkeypatch, sync):
    sampler = engine.runner.sampler

    class SyncingSampler:
        def __call__(self, logits, params, output_indices):
            drawn = sampler(logits, params, output_indices)
            sync(drawn.tokens)
            return drawn

    engine.runner.sampler = SyncingSampler()
    engine.generate(_requests(KINDS["sampled"]))
    assert all(syncs for _, syncs in engine.steps)  # every step samples, every step synced
