"""What each kind of prefix sharing saves: the engine as it ships against it with one kind switched off,
in one process, on the default model (bf16, greedy).

    python bench/prefix_sharing_bench.py [--rounds 2]

Workloads:
- prompt-heavy: vllm_peer_bench's 48 chat prompts of 50-400 tokens, 64 new tokens each;
- decode-heavy: its 512 short chat tickets, 64 new tokens each;
- multiple choice: 96 prompts of 40-200 random tokens, each with 4 continuations of 4-23 tokens, scored.
Variants (each run a fresh Engine, so a cold prefix cache, over the one loaded model; rounds alternate):
- as shipped;
- whole blocks only: no cached block serves the leading tokens it shares with a request's next block
  (KVCacheManager.partial_hit finds none);
- no sharing in flight: a request admitted in a step never shares the blocks another row of that step
  fills (KVCacheManager.note_in_flight offers none);
- children recompute: a scoring child computes its parent's last, partial block again instead of
  copying it (KVCacheManager.copy_partial_block does nothing).
Printed per workload and variant: the median engine time, the tokens the steps computed and the prompt
tokens served from the cache (the parent's prompt, for scored requests).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from contextlib import contextmanager

from workload import chat_prompts

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.engine import Engine
from bulkrun.engine.core.kv_cache_manager import KVCacheManager
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun.job.stats import RunStats
from bulkrun.model_source import resolve_model

NEW_TOKENS = 64
OFF = {  # variant -> the KVCacheManager method that, replaced, switches its sharing off
    "whole blocks only": ("partial_hit", lambda self, req, hits: (-1, 0)),
    "no sharing in flight": ("note_in_flight", lambda self, req, end: None),
    "children recompute": ("copy_partial_block", lambda self, source, target, num_tokens: None),
}


@contextmanager
def variant(name: str):
    if name not in OFF:
        yield
        return
    method, replacement = OFF[name]
    original = getattr(KVCacheManager, method)
    setattr(KVCacheManager, method, replacement)
    try:
        yield
    finally:
        setattr(KVCacheManager, method, original)


def generate_requests(prompts: list[list[int]]) -> list[EngineRequest]:
    return [EngineRequest(f"g{i}", p, SamplingParams(max_tokens=NEW_TOKENS)) for i, p in enumerate(prompts)]


def choice_requests(vocab: int, seed: int = 0) -> list[EngineRequest]:
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    return [
        EngineRequest(
            f"c{i}", ids(rng.randrange(40, 201)), continuations=[ids(rng.randrange(4, 24)) for _ in range(4)]
        )
        for i in range(96)
    ]


def run(base: Engine, requests: list[EngineRequest]) -> dict:
    engine = Engine(base.runner, EngineConfig())  # a cold prefix cache over the loaded model
    stats = RunStats()
    t0 = time.perf_counter()
    outputs = list(engine.stream(requests, on_step=stats.on_step))
    return {
        "seconds": time.perf_counter() - t0,
        "computed": stats.scheduled_tokens,
        "cached": sum(o.num_cached_tokens for o in outputs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base = load_engine(str(resolve_model(None)), EngineConfig(dtype="bfloat16"))
    tokenizer = base.runner.tokenizer
    workloads = {
        "prompt-heavy": generate_requests(chat_prompts(tokenizer, 48, 50, 400)),
        "decode-heavy": generate_requests(chat_prompts(tokenizer, 512, 20, 80)),
        "multiple choice": choice_requests(base.runner.vocab_size),
    }
    variants = {
        "prompt-heavy": ["as shipped", "whole blocks only", "no sharing in flight"],
        "decode-heavy": ["as shipped", "whole blocks only", "no sharing in flight"],
        "multiple choice": ["as shipped", "children recompute"],
    }
    run(base, workloads["prompt-heavy"][:8])  # warm-up: thread pools, buffers, packed weights
    for name, requests in workloads.items():
        results: dict[str, list[dict]] = {v: [] for v in variants[name]}
        for r in range(args.rounds):
            order = variants[name] if r % 2 == 0 else variants[name][::-1]
            for v in order:
                with variant(v):
                    results[v].append(run(base, requests))
        print(f"{name}: {len(requests)} requests; medians of {args.rounds} round(s)")
        shipped = statistics.median(m["seconds"] for m in results["as shipped"])
        for v, runs in results.items():
            seconds = statistics.median(m["seconds"] for m in runs)
            print(
                f"  {v:22s} engine {seconds:6.2f} s ({seconds / shipped:5.2f}x as shipped)  "
                f"computed {runs[0]['computed']:6d} tokens  cached {runs[0]['cached']:6d} prompt tokens"
            )


if __name__ == "__main__":
    main()
