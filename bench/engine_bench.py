"""Engine benchmark: bulkrun against transformers on one workload, in one process, on this machine.

Workload: 48 chat prompts of 50-400 tokens, up to 64 new tokens, greedy, default model (fp32, CPU).
Peers: transformers `generate` at batch 1, static left-padded batches of 16, and transformers' own
continuous batching (`generate_batch`). Also: the fraction of the machine's matmul rate bulkrun reached,
and the gain of prefix caching on a workload with a long shared instruction.

    .venv/bin/python bench/engine_bench.py [--prompts 48] [--max-new 64] [--batch1-prompts 8] [--repeats 3]

The machine is noisy, so bulkrun and the binding baseline (static batches of 16) run --repeats times
and their medians are compared; batch 1 and generate_batch, far behind, run once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import chat_prompts, matmul_gflops, model_flops_per_token, shared_prefix_prompts  # noqa: E402

from bulkrun.engine.config import EngineConfig  # noqa: E402
from bulkrun.engine.engine import Engine  # noqa: E402
from bulkrun.engine.params import EngineRequest, SamplingParams  # noqa: E402
from bulkrun.model_source import resolve_model  # noqa: E402


def run_bulkrun(engine: Engine, prompts: list[list[int]], max_new: int) -> tuple[float, int]:
    """One run on a cold prefix cache: a fresh Engine (scheduler, block pool) over the loaded model,
    so a repeat never reuses the KV blocks of the previous run's identical prompts."""
    engine = Engine(engine.runner, engine.config)
    params = SamplingParams(max_tokens=max_new)
    requests = [EngineRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    outputs = engine.generate(requests)
    return time.perf_counter() - t0, sum(len(o.output_token_ids) for o in outputs)


def _generated_len(row: list[int], eos: set[int]) -> int:
    for i, tok in enumerate(row):
        if tok in eos:
            return i + 1
    return len(row)


def run_hf_batch1(model, prompts, max_new: int, eos: set[int]) -> tuple[float, int]:
    t0, generated = time.perf_counter(), 0
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False
        )
        generated += _generated_len(out[0, len(p) :].tolist(), eos)
    return time.perf_counter() - t0, generated


def run_hf_static(model, prompts, max_new: int, eos: set[int], pad_id: int, batch: int = 16):
    t0, generated = time.perf_counter(), 0
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=pad_id
        )
        generated += sum(_generated_len(row[width:].tolist(), eos) for row in out)
    return time.perf_counter() - t0, generated


def run_hf_generate_batch(model, prompts, max_new: int, eos_id: int, pad_id: int) -> tuple[float, int]:
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_new, do_sample=False, eos_token_id=eos_id, pad_token_id=pad_id
    )
    t0 = time.perf_counter()
    out = model.generate_batch(prompts, generation_config=config)
    return time.perf_counter() - t0, sum(len(r.generated_tokens) for r in out.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--batch1-prompts", type=int, default=8, help="batch 1 is slow: run it on a subset")
    ap.add_argument("--repeats", type=int, default=3, help="runs of bulkrun and static-16 (median)")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model_dir = resolve_model(None)
    engine = Engine.from_model(str(model_dir), EngineConfig())
    tok = engine.tokenizer
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos_id, pad_id = tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = {eos_id}
    prompts = chat_prompts(tok, n=args.prompts)
    prompt_tokens = sum(map(len, prompts))
    print(
        f"workload: {len(prompts)} prompts, {prompt_tokens} prompt tokens "
        f"({min(map(len, prompts))}-{max(map(len, prompts))}), up to {args.max_new} new tokens, greedy"
    )

    gflops = matmul_gflops()
    run_bulkrun(engine, prompts[:4], 4)  # warm-up
    rows = []

    def record(name: str, result: tuple[float, int]) -> None:
        rows.append((name, *result))  # printed as it lands: the slow peers take minutes
        print(f"  {name:<48} {result[1]:>6} tokens in {result[0]:7.1f} s", flush=True)

    def median_of(run, *run_args) -> tuple[float, int]:
        results = [run(*run_args) for _ in range(args.repeats)]
        print(f"    runs: {', '.join(f'{secs:.1f} s' for secs, _ in results)}", flush=True)
        return statistics.median(secs for secs, _ in results), results[0][1]

    record("bulkrun", median_of(run_bulkrun, engine, prompts, args.max_new))
    sub = prompts[: args.batch1_prompts]
    with torch.inference_mode():
        record(
            f"transformers generate, batch 1 ({len(sub)} prompts)", run_hf_batch1(hf, sub, args.max_new, eos)
        )
        record(
            "transformers generate, static batch 16",
            median_of(run_hf_static, hf, prompts, args.max_new, eos, pad_id),
        )
        record(
            "transformers generate_batch (continuous)",
            run_hf_generate_batch(hf, prompts, args.max_new, eos_id, pad_id),
        )

    rate = {name: gen / secs for name, secs, gen in rows}
    ours = rate["bulkrun"]
    print(f"\n{'system':<48} {'gen tok':>8} {'seconds':>8} {'tok/s':>8} {'bulkrun x':>10}")
    for name, secs, gen in rows:
        print(f"{name:<48} {gen:>8} {secs:>8.1f} {gen / secs:>8.1f} {ours / (gen / secs):>9.2f}x")
    best_batched = max(v for k, v in rate.items() if "static" in k or "generate_batch" in k)
    print(
        f"\nbulkrun vs the better of static-16 and generate_batch: {ours / best_batched:.2f}x (target >= 3x)"
    )

    config = hf.config
    mean_context = (prompt_tokens / len(prompts) + args.max_new / 2) / 2
    flops = prompt_tokens * (
        model_flops_per_token(config, mean_context) - 2 * config.hidden_size * config.vocab_size
    )
    flops += rows[0][2] * model_flops_per_token(config, mean_context)
    achieved = flops / rows[0][1] / 1e9
    print(
        f"matmul rate of this machine (fp32 1024^3, best of 15): {gflops:.1f} GFLOP/s; "
        f"bulkrun reached {achieved:.1f} GFLOP/s = {100 * achieved / gflops:.0f}% of it"
    )

    del engine, hf  # free the KV cache and the reference model before the next engines
    shared = shared_prefix_prompts(tok, n=args.prompts)
    print(
        f"\nprefix caching: {len(shared)} prompts of ~{sum(map(len, shared)) // len(shared)} tokens sharing "
        f"a long instruction, 16 new tokens"
    )
    results = {}
    for on in (False, True):
        eng = Engine.from_model(
            str(model_dir), EngineConfig(enable_prefix_caching=on, kv_cache_bytes=1 << 30)
        )
        secs, gen = run_bulkrun(eng, shared, 16)
        results[on] = secs
        print(f"  prefix cache {'on ' if on else 'off'}: {secs:6.1f} s  ({len(shared) / secs:.2f} prompts/s)")
    print(f"  gain: {results[False] / results[True]:.2f}x")


if __name__ == "__main__":
    main()
