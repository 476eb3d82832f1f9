"""Host (Python) overhead of one engine decode step, per sequence, with the model's compute taken out.

A 1-layer random Llama keeps the model cheap; the time inside the model (final_hidden, logits) and
the greedy head is measured and subtracted from Engine.step's wall time, which leaves what the
scheduler, the step inputs and the result handling cost: on a GPU this is what the device would
wait for if it were not overlapped.

Then the overlap of async scheduling is shown with a simulated device (tests/engine/engine_fakes.py):
a runner whose results land a set time after launch (a sleeping worker thread, outside the GIL),
by default as long as the host part just measured. Synchronous stepping costs about device + host
per step, async about max(device, host).

Last, the model forward's own fixed cost: a 30-layer model of width 64, whose compute is negligible,
timed inside the model per decode step (Python, op dispatch, thread hand-offs).

    .venv/bin/python bench/host_overhead.py [--shapes 256x32,1024x512] [--steps 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "engine")]
from engine_fakes import SimulatedDeviceRunner  # noqa: E402
from helpers.models import build_tiny_model  # noqa: E402

from bulkrun.engine.core.config import EngineConfig  # noqa: E402
from bulkrun.engine.core.engine import Engine  # noqa: E402
from bulkrun.engine.load import load_engine
from bulkrun.engine.core.params import EngineRequest, SamplingParams  # noqa: E402


def one_layer_model(folder: Path) -> None:
    build_tiny_model("llama", folder, num_hidden_layers=1, max_position_embeddings=4096)


class ModelClock:
    """Accumulates the wall time spent inside the model and the greedy head."""

    def __init__(self, runner):
        self.seconds = 0.0
        model = runner.model
        model.final_hidden = self._timed(model.final_hidden)
        model.logits = self._timed(model.logits)
        if runner.greedy_head is not None:
            runner.greedy_head = self._timed(runner.greedy_head)

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return wrapper


def requests(num_seqs: int, prompt_len: int, max_new: int, vocab: int = 90) -> list[EngineRequest]:
    params = SamplingParams(max_tokens=max_new, ignore_eos=True)
    # distinct first tokens: no prefix-cache sharing between sequences
    return [
        EngineRequest(f"r{i}", [1 + (i + j) % (vocab - 2) for j in range(prompt_len)], params)
        for i in range(num_seqs)
    ]


def build_engine(model_dir: str, num_seqs: int, prompt_len: int, steps: int, **overrides) -> Engine:
    blocks = num_seqs * (-(-(prompt_len + steps + 8) // 16) + 1)
    config = EngineConfig(
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max(8192, num_seqs),
        kv_cache_bytes=blocks * 16 * 2 * 2 * 16 * 4,  # 1 layer, 2 kv heads x 16 dims, fp32
        **overrides,
    )
    return load_engine(model_dir, config)


def host_us_per_seq(model_dir: str, num_seqs: int, prompt_len: int, steps: int) -> tuple[float, float, float]:
    """(host us per sequence per decode step: median and best step, model ms per step), synchronous
    stepping. The box is shared: the median moves with the neighbours, the best step much less."""
    engine = build_engine(model_dir, num_seqs, prompt_len, steps, async_scheduling=False)
    for r in requests(num_seqs, prompt_len, steps + 64):
        engine.add_request(r)
    while True:  # prefill until every sequence decodes
        engine.step()
        s = engine.last_stats
        if s.num_decode_tokens == num_seqs:
            break
    clock = ModelClock(engine.runner)
    host, model = [], []
    for _ in range(steps):
        before = clock.seconds
        t0 = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - t0
        assert engine.last_stats.num_decode_tokens == num_seqs
        host.append(wall - (clock.seconds - before))
        model.append(clock.seconds - before)
    host.sort()
    median = host[len(host) // 2]
    return median / num_seqs * 1e6, host[0] / num_seqs * 1e6, sorted(model)[len(model) // 2] * 1e3


def forward_fixed_ms(folder: Path, layers: int = 30, num_seqs: int = 8, steps: int = 40) -> float:
    """Median ms per decode step inside the model for `layers` layers of width 64, where the compute
    is negligible: what every step pays for Python, op dispatch and threads whatever the model's size."""
    build_tiny_model("llama", folder, num_hidden_layers=layers)
    engine = load_engine(str(folder), EngineConfig(max_num_seqs=num_seqs, kv_cache_bytes=64 << 20))
    for r in requests(num_seqs, 4, steps + 8):
        engine.add_request(r)
    for _ in range(100):  # prefill until every sequence decodes
        engine.step()
        if engine.last_stats.num_decode_tokens == num_seqs:
            break
    clock = ModelClock(engine.runner)
    model = []
    for _ in range(steps):
        before = clock.seconds
        engine.step()
        model.append(clock.seconds - before)
    return sorted(model)[len(model) // 2] * 1e3


def overlap(num_seqs: int, prompt_len: int, steps: int, device_ms: float) -> dict[str, float]:
    """Median wall time of a decode step (ms) with a simulated device taking device_ms a step,
    the step of N+1 scheduled before or after step N's tokens land."""
    out = {}
    for name, flag in (("sync", False), ("async", True)):
        blocks = num_seqs * (-(-(prompt_len + 2 * steps + 16) // 16) + 1)
        runner = SimulatedDeviceRunner(device_ms / 1e3, num_blocks=blocks, block_size=16)
        config = EngineConfig(
            max_num_seqs=num_seqs, max_num_batched_tokens=max(8192, num_seqs), async_scheduling=flag
        )
        engine = Engine(runner, config)
        stamps = []

        def on_step(stats, stamps=stamps):
            if stats.num_decode_tokens == num_seqs:
                stamps.append(time.perf_counter())

        for _ in engine.stream(requests(num_seqs, prompt_len, steps + 4, vocab=64), on_step=on_step):
            pass
        gaps = sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False))
        out[name] = gaps[len(gaps) // 2] * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="256x32,1024x512", help="sequences x prompt tokens, comma separated")
    ap.add_argument("--steps", type=int, default=40, help="timed decode steps per shape")
    ap.add_argument("--device-ms", type=float, default=0.0, help="simulated device time per step (0: = host)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one_layer_model(Path(tmp))
        for shape in args.shapes.split(","):
            n, p = (int(x) for x in shape.split("x"))
            us, best, model_ms = host_us_per_seq(tmp, n, p, args.steps)
            print(
                f"{n:5d} seqs x {p:4d} prompt tokens: host {us:.2f} us/seq/step, best step {best:.2f} "
                f"({us * n / 1e3:.2f} ms/step; model {model_ms:.2f} ms/step)"
            )
            device_ms = args.device_ms or max(0.5, us * n / 1e3)
            o = overlap(n, p, args.steps, device_ms)
            print(
                f"      simulated device {device_ms:.2f} ms/step: sync {o['sync']:.2f} ms/step, "
                f"async {o['async']:.2f} ms/step  (sync - device = host {o['sync'] - device_ms:.2f} ms)"
            )
    with tempfile.TemporaryDirectory() as tmp:
        ms = forward_fixed_ms(Path(tmp))
        print(
            f"model forward's fixed cost, 30 layers of width 64, 8 rows: {ms:.2f} ms/step ({ms / 30 * 1e3:.0f} us/layer)"
        )


if __name__ == "__main__":
    main()
