"""The padded static-buffer path of captured decode steps, run eagerly on the CPU: same tokens as
the unpadded path, padding rows never touch a block the scheduler hands out."""

from __future__ import annotations

import contextlib

import pytest
from helpers.models import VOCAB, build_tiny_model

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.worker import decode_graphs
from bulkrun.engine.worker.decode_graphs import DecodeGraphs, graph_batch_sizes
from bulkrun.engine.worker.runner import ModelRunner


def test_batch_sizes_are_padded_up_to_the_running_limit():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(6) == [1, 2, 4, 6]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert graph_batch_sizes(1024)[-1] == 512 and graph_batch_sizes(1024)[-2] == 504


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    build_tiny_model("llama", folder)
    return str(folder)


def _run(model_dir, padded: bool, kernels: str):
    config = EngineConfig(
        block_size=4,
        kv_cache_bytes=1 << 20,
        dtype="float32",
        max_num_seqs=8,
        kernels=kernels,
        cuda_graphs=False,
    )
    runner = ModelRunner(model_dir, config)
    used = []
    if padded:
        graphs = DecodeGraphs(runner, [1, 2, 4, 8])  # not captured: the static buffers run eagerly
        run = graphs.run

        def record(inputs):
            h = run(inputs)
            used.append((inputs.num_rows, inputs.metadata.block_tables.shape[1], h is not None))
            return h

        graphs.run = record
        runner.graphs = graphs
    engine = Engine(runner, config)
    requests = [
        EngineRequest(f"r{i}", [3 + (7 * i + j) % (VOCAB - 3) for j in range(2 + 3 * i)],
                      SamplingParams(max_tokens=4 + 2 * i, ignore_eos=True))
        for i in range(7)
    ]  # fmt: skip
    return [o.output_token_ids for o in engine.generate(requests)], used


@pytest.mark.parametrize("kernels", ["cpu", "reference"])
def test_padded_decode_steps_give_the_unpadded_tokens(model_dir, kernels):
    plain, _ = _run(model_dir, padded=False, kernels=kernels)
    padded, used = _run(model_dir, padded=True, kernels=kernels)
    assert padded == plain
    assert {n for n, _, ran in used if ran} & {3, 5, 6, 7}  # batches that really were padded (to 4 or 8)


def test_steps_with_contexts_past_the_graph_width_run_eagerly(model_dir, monkeypatch):
    # graphs cover 6 blocks of 4 tokens: a decode step with a longer context must not be cut
    # to that width (the kernel would plan for, and read, a wrong context bound)
    monkeypatch.setattr(decode_graphs, "graph_context_tokens", lambda: 24)
    plain, _ = _run(model_dir, padded=False, kernels="cpu")
    padded, used = _run(model_dir, padded=True, kernels="cpu")
    assert padded == plain
    assert {ran for _, width, ran in used if width <= 6} == {True}
    assert {ran for _, width, ran in used if width > 6} == {False}


def test_graphs_are_captured_only_with_the_triton_kernels_on_cuda():
    assert decode_graphs.capture_wanted("cuda", True, "triton")
    assert not decode_graphs.capture_wanted("cuda", True, "reference")  # plans each step on the host
    assert not decode_graphs.capture_wanted("cuda", False, "triton")
    assert not decode_graphs.capture_wanted("cpu", True, "triton")


class FakeCapture:
    """GraphCapture without a GPU: records what happens; raises where a test says."""

    def __init__(self, sync_in_warm_up=False, fail_at_capture=None):
        self.sync_in_warm_up, self.fail_at_capture = sync_in_warm_up, fail_at_capture
        self.events, self.in_sync_errors, self.capturing = [], False, False

    @contextlib.contextmanager
    def sync_errors(self):
        self.in_sync_errors = True
        try:
            yield
        finally:
            self.in_sync_errors = False

    def synchronize(self):
        self.events.append("synchronize")

    def new_graph(self):
        class Graph:
            def pool(self):
                return "pool"

            def replay(self):
                raise AssertionError("a failed capture left a graph behind")

        self.events.append("graph")
        return Graph()

    @contextlib.contextmanager
    def capture(self, graph, pool):
        self.capturing = True
        self.events.append(f"capture pool={pool}")
        try:
            if len([e for e in self.events if e.startswith("capture")]) == self.fail_at_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
            yield
        finally:
            self.capturing = False  # the real one ends the capture and restores the stream


@pytest.fixture
def runner(model_dir):
    config = EngineConfig(
        block_size=4, kv_cache_bytes=1 << 20, dtype="float32", max_num_seqs=8, kernels="cpu"
    )
    return ModelRunner(model_dir, config)


def test_a_sync_in_the_warm_up_disables_graphs_before_any_capture(runner, monkeypatch):
    fake = FakeCapture()

    def syncing_forward(self, size):
        assert fake.in_sync_errors  # the warm-up runs under set_sync_debug_mode("error")
        raise RuntimeError("called a synchronizing CUDA operation")

    monkeypatch.setattr(DecodeGraphs, "_forward", syncing_forward)
    assert DecodeGraphs.capture(runner, [1, 2, 4, 8], cuda=fake) is None
    assert not any(e.startswith("capture") for e in fake.events)


def test_a_failed_capture_leaves_the_runner_usable(runner):
    fake = FakeCapture(fail_at_capture=3)  # sizes 8 and 4 captured, 2 fails
    assert DecodeGraphs.capture(runner, [1, 2, 4, 8], cuda=fake) is None
    assert not fake.capturing
    assert [e for e in fake.events if e.startswith("capture")] == [
        "capture pool=None",
        "capture pool=pool",
        "capture pool=pool",
    ]
    runner.graphs = None  # what the runner keeps: every step eager
    engine = Engine(runner, runner.config)
    out = engine.generate([EngineRequest("a", [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))])
    assert len(out[0].output_token_ids) == 3


def test_every_size_is_warmed_up_then_captured_largest_first(runner):
    fake = FakeCapture()
    graphs = DecodeGraphs.capture(runner, [1, 2, 4, 8], cuda=fake)
    assert sorted(graphs.graphs) == [1, 2, 4, 8]
    assert fake.events[0] == "synchronize"  # after the warm-up, before the first capture
