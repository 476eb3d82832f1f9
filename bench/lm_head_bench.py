"""The LM head of a greedy decode step on the CPU: the full fp32 head against the screened greedy heads
(bf16 screen; int8 screen on AMX int8 tiles or AVX512-VNNI), warm and with the head cold in the caches.

The rows are the final hidden rows of a real decode step of the engine bench's workload (default
model, 48 chat prompts, greedy), so the screen sees real logit distributions. Prints medians in ms
and checks that both heads pick the same tokens.

    .venv/bin/python bench/lm_head_bench.py [--prompts 48] [--repeats 50] [--rows 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import chat_prompts  # noqa: E402

from bulkrun.engine.core.config import EngineConfig  # noqa: E402
from bulkrun.engine.core.engine import Engine  # noqa: E402
from bulkrun.engine.load import load_engine
from bulkrun.engine.core.params import EngineRequest, SamplingParams  # noqa: E402
from bulkrun.model.greedy_head import ScreenedGreedyHead  # noqa: E402
from bulkrun.model_source import resolve_model  # noqa: E402
from bulkrun_kernels.cpu_greedy import int8_screen_available, vnni_screen_available  # noqa: E402


def decode_rows(engine: Engine, prompts: list[list[int]]) -> torch.Tensor:
    """The greedy head's input at the first step where every request decodes (prompts arrive in
    chunks over several steps, so that takes a few tokens)."""
    head, seen = engine.runner.greedy_head, []
    engine.runner.greedy_head = lambda h: seen.append(h.clone()) or head(h)
    try:
        engine.generate(
            [
                EngineRequest(f"r{i}", p, SamplingParams(max_tokens=16, ignore_eos=True))
                for i, p in enumerate(prompts)
            ]
        )
    finally:
        engine.runner.greedy_head = head
    return next(h for h in seen if h.shape[0] == len(prompts))


def median_ms(fn, repeats: int, evict: torch.Tensor | None = None) -> float:
    """Median ms of fn; with `evict`, each call after reading that buffer (the head cold in the caches, as
    a decode step meets it after streaming the layers' weights)."""
    fn()
    times = []
    for _ in range(repeats):
        if evict is not None:
            evict.sum()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument(
        "--rows", type=int, default=0, help="the captured rows repeated to this many (0: as captured)"
    )
    args = parser.parse_args()
    engine = load_engine(str(resolve_model(None)), EngineConfig())
    runner = engine.runner
    if runner.greedy_head is None:
        sys.exit("no screened greedy head here (needs the native CPU kernels and native bf16)")
    h = decode_rows(engine, chat_prompts(runner.tokenizer, n=args.prompts)).float()
    if args.rows:
        h = h.repeat(-(-args.rows // h.shape[0]), 1)[: args.rows].contiguous()
    want = runner.model.logits(h).argmax(dim=-1)
    head = ScreenedGreedyHead(runner.greedy_head.weight, int8=False)
    assert torch.equal(head(h), want), "the heads disagree"
    bf16 = lambda: head.screen(h)  # noqa: E731
    approx = bf16()
    rows = {
        "fp32 head (oneDNN)": lambda: runner.model.logits(h),
        "fp32 head + argmax": lambda: runner.model.logits(h).argmax(dim=-1),
        f"bf16 product ({'dpbf16_gemm' if head.dpbf16 else 'oneDNN'})": bf16,
        "screen + exact check": lambda: torch.ops.bulkrun_cpu.greedy_head(approx, h, head.weight, head.norms),
        "bf16-screened head": lambda: head(h),
    }
    if int8_screen_available() or vnni_screen_available():
        int8 = ScreenedGreedyHead(head.weight, int8=True)
        assert torch.equal(int8(h), want), "the int8-screened head disagrees"
        rows[f"int8-screened head ({'AMX' if int8.int8 is not None else 'VNNI'})"] = lambda: int8(h)
    print(
        f"LM head, {h.shape[0]} rows x {h.shape[1]} -> {runner.vocab_size}, {torch.get_num_threads()} threads"
        "; warm, and cold (after reading 512 MB)"
    )
    evict = torch.ones(2**27)
    for name, fn in rows.items():
        warm, cold = median_ms(fn, args.repeats), median_ms(fn, args.repeats, evict)
        print(f"  {name:<26} {warm:7.2f} ms {cold:7.2f} ms")


if __name__ == "__main__":
    main()
