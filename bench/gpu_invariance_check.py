"""Batch invariance on the GPU (gpu_check.sh stage 10), bf16, on the engine checks' random Llama:

  invariance  the same requests (greedy and seeded sampled, log-probabilities on) run each alone, all
              together in one big batch, and reversed under a small token budget with few sequences
              (other prefill chunks, other batch mates, other CUDA-graph sizes) give the same tokens
              and log-probabilities, bit for bit
  cost        generated tokens/s with EngineConfig.batch_invariant on and off on one workload, and
              (a figure, not a verdict) how many of the requests move with the batch when it is off

docs/batch-invariance.md says what invariance changes on CUDA. Phases write their figures as they
end (gpu_stage.Stage); the cost phase is skipped when the stage's time is short.
Exit status: 0 pass, 1 a check failed, 2 cannot run here, 3 not available in this engine.

    python bench/gpu_invariance_check.py --device cuda --json out.json
    TRITON_INTERPRET=1 python bench/gpu_invariance_check.py --device cpu --tiny   # smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import free_memory as release  # noqa: E402
from gpu_engine_check import NOT_AVAILABLE, check_graphs_captured, engine_config, timed_generate  # noqa: E402
from gpu_model import CHECK, TINY, build_model_dir, make_prompts  # noqa: E402
from gpu_stage import Stage  # noqa: E402

from bulkrun.engine.core.params import EngineRequest, SamplingParams  # noqa: E402
from bulkrun.engine.load import load_engine  # noqa: E402

COST_NEEDS_S = 15  # a second engine's load, and the alternating timed runs
ROUNDS = 3


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="tiny model and workload (smoke run)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="fewer CUDA graph sizes to capture")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.dtype = "bfloat16"  # where batch invariance is hard: bf16 GEMMs round per tile
    return args


def requests(prompts, max_tokens: int, tag: str) -> list[EngineRequest]:
    """Even ones greedy, odd ones sampled with their own seed; every token's log-probability."""
    return [
        EngineRequest(f"{tag}{i}", p, SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, logprobs=True,
            temperature=0.8 if i % 2 else 0.0, seed=i if i % 2 else None))
        for i, p in enumerate(prompts)
    ]  # fmt: skip


def results(outputs) -> dict[int, tuple[list[int], list[float]]]:
    """request number -> (tokens, log-probabilities), whatever the one-letter tag."""
    return {int(o.request_id[1:]): (list(o.output_token_ids), list(o.logprobs or [])) for o in outputs}


def alone_and_together(engine, prompts, max_tokens: int):
    alone = {}
    for request in requests(prompts, max_tokens, "a"):
        alone |= results(engine.generate([request]))
    return alone, results(engine.generate(requests(prompts, max_tokens, "t")))


def moved(run: dict, alone: dict) -> int:
    return sum(run[i] != alone[i] for i in alone)


def how_moved(run: dict, alone: dict) -> list[str]:
    """Each moved request: greedy or sampled, and the first output index whose token or log-probability
    differs (what tells a logits bug from a sampling one)."""
    notes = []
    for i in sorted(alone):
        if run[i] == alone[i]:
            continue
        (tokens, logprobs), (tokens0, logprobs0) = run[i], alone[i]
        first_token = next((j for j, (a, b) in enumerate(zip(tokens, tokens0, strict=False)) if a != b), None)
        first_logprob = next(
            (j for j, (a, b) in enumerate(zip(logprobs, logprobs0, strict=False)) if a != b), None
        )
        kind = "sampled" if i % 2 else "greedy"
        notes.append(f"request {i} ({kind}): first token difference at {first_token}, "
                     f"first log-probability difference at {first_logprob}")  # fmt: skip
    return notes


def check_invariance(args, stage: Stage, model_dir: Path, engine, prompts, max_tokens: int) -> None:
    alone, together = alone_and_together(engine, prompts, max_tokens)
    budget = 8 if args.tiny else 64
    small = load_engine(str(model_dir), engine_config(args, kernels="auto", max_num_batched_tokens=budget,
                                                      max_num_seqs=4))  # fmt: skip
    chunked = results(small.generate(requests(prompts, max_tokens, "c")[::-1]))
    del small
    release(args.device)
    runs = {"all together": together, f"reversed, {budget}-token budget, 4 sequences": chunked}
    figures = {"requests": len(prompts), "prompt_lengths": [len(p) for p in prompts], "max_tokens": max_tokens,
               "moved_from_alone": {name: moved(run, alone) for name, run in runs.items()},
               "how_moved": {name: how_moved(run, alone) for name, run in runs.items()}}  # fmt: skip
    for name, count in figures["moved_from_alone"].items():
        print(f"{name}: {len(prompts) - count}/{len(prompts)} requests the same bits as alone", flush=True)
        for note in figures["how_moved"][name]:
            print(f"  {note}", flush=True)
    ok = not any(figures["moved_from_alone"].values())
    stage.done("invariance", figures, ok, f"invariant: {sum(figures['moved_from_alone'].values())} of "
               f"{len(prompts) * len(runs)} reruns moved")  # fmt: skip


def check_cost(args, stage: Stage, model_dir: Path, engine, prompts, max_tokens: int) -> int:
    """Generated tokens/s with invariance on and off: both engines loaded, ROUNDS alternating timed
    runs of the same workload, medians (one short run per side reads the device's warm-up, not the
    kernels)."""
    if not stage.fits("cost", COST_NEEDS_S):
        return 0
    num, new, lo, hi = (6, 6, 5, 40) if args.tiny else (256, 128, 64, 512)
    workload = make_prompts(num, lo, hi, engine.vocab_size, seed=8)
    config = engine_config(args, kernels="auto", batch_invariant=False)
    if config is None:
        return NOT_AVAILABLE
    loose = load_engine(str(model_dir), config)
    check_graphs_captured(loose, config)
    seconds = {"invariant": [], "not_invariant": []}
    for _ in range(ROUNDS):
        seconds["invariant"].append(timed_generate(engine, workload, new)[1])
        seconds["not_invariant"].append(timed_generate(loose, workload, new)[1])
    alone, together = alone_and_together(loose, prompts, max_tokens)
    del loose
    release(args.device)
    on, off = (num * new / statistics.median(seconds[side]) for side in ("invariant", "not_invariant"))
    figures = {"workload": f"{num} prompts of {lo}-{hi} tokens, {new} new tokens each", "rounds": ROUNDS,
               "seconds": seconds, "gen_tps_invariant": on, "gen_tps_not_invariant": off, "cost": off / on - 1,
               "not_invariant_moved_together": moved(together, alone)}  # fmt: skip
    print(f"invariant {on:.0f} tok/s, not invariant {off:.0f} tok/s (medians of {ROUNDS} alternating rounds); "
          f"with it off {figures['not_invariant_moved_together']}/{len(prompts)} requests move in a batch",
          flush=True)  # fmt: skip
    stage.done(
        "cost", figures, True, f"invariance costs {figures['cost']:+.1%} ({on:.0f} vs {off:.0f} tok/s)"
    )
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_invariance_check: error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    stage = Stage(args.json)
    shape = TINY if args.tiny else CHECK
    if args.tiny:  # a few chunks each under the small budget
        prompts, max_tokens = make_prompts(6, 3, 40, shape.vocab, seed=7), 6
    else:  # one block to many, and a long context decoding alone (where split-KV would pay off)
        prompts = make_prompts(11, 16, 1500, shape.vocab, seed=7) + make_prompts(
            1, 5000, 5000, shape.vocab, seed=9
        )
        max_tokens = 16
    with tempfile.TemporaryDirectory(prefix="bulkrun-invariance-check-") as tmp:
        model_dir = Path(tmp)
        build_model_dir(shape, torch.bfloat16, args.device, model_dir, max_positions=8192)
        print(f"invariance: {shape} bf16 on {args.device}, {len(prompts)} requests", flush=True)
        config = engine_config(args, kernels="auto")
        engine = load_engine(str(model_dir), config)
        check_graphs_captured(engine, config)
        check_invariance(args, stage, model_dir, engine, prompts, max_tokens)
        code = check_cost(args, stage, model_dir, engine, prompts, max_tokens)
    print(f"invariance: {'ok' if stage.ok else 'FAILED'}")
    return code or stage.exit_code()


if __name__ == "__main__":
    sys.exit(main())
