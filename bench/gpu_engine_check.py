"""Whole-engine checks on a random Llama (gpu_check.sh stages 04-06), one per subcommand:

  numerics  the engine on Triton vs on the reference ops, greedy, full sequences: how many are
            identical, and every generated token judged against an fp32 transformers forward of the
            same sequence (its fp32 logit within --tie-tolerance of the best one: bf16 may break near
            ties differently, a kernel bug picks wrong tokens everywhere)
  graphs    CUDA graphs vs eager (EngineConfig.cuda_graphs): same judgement, identical sequences, speed
  memory    KV-cache sizing: the engine's chosen limits, profile peak, blocks, free memory after, and a
            step at the full token budget with a long scoring request

Exit status: 0 pass, 1 a check failed, 2 cannot run here, 3 not available in this engine (an
EngineConfig field the check needs is missing).

    python bench/gpu_engine_check.py numerics --device cuda --json out.json
    TRITON_INTERPRET=1 python bench/gpu_engine_check.py numerics --device cpu --tiny    # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import free_memory as release  # noqa: E402
from gpu_bench import synchronize as sync  # noqa: E402
from gpu_model import CHECK, TINY, build_model_dir, hf_dtype, make_prompts  # noqa: E402

from bulkrun.engine.core.config import EngineConfig  # noqa: E402
from bulkrun.engine.load import load_engine
from bulkrun.engine.core.params import EngineRequest, SamplingParams  # noqa: E402

NOT_AVAILABLE = 3
GIB = 1 << 30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("check", choices=["numerics", "graphs", "memory"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="tiny model and workload (smoke run)")
    p.add_argument("--tie-tolerance", type=float, default=0.1, help="fp32 logit gap counted as a tie")
    p.add_argument("--max-bad-fraction", type=float, default=0.02, help="tokens allowed beyond a tie")
    p.add_argument("--max-num-seqs", type=int, default=64, help="fewer CUDA graph sizes to capture")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    return args


def engine_config(args, **overrides) -> EngineConfig:
    """A config with the given fields; None when the engine lacks one of them (not available)."""
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    missing = [name for name in overrides if name not in fields]
    if missing:
        print(f"not available: EngineConfig has no {', '.join(missing)}", flush=True)
        return None
    base = {"device": args.device, "dtype": args.dtype, "enable_prefix_caching": False,
            "max_num_seqs": args.max_num_seqs}  # fmt: skip
    if args.device == "cuda" and "kv_cache_bytes" not in overrides:
        base["kv_cache_bytes"] = 4 * GIB  # leave room for the fp32 judge; memory checks the default
    return EngineConfig(**{**base, **overrides})


def workload(args, vocab: int) -> tuple[list[list[int]], int]:
    """Prompts of 16..1,200 tokens plus two of 3,000 (split-KV decode), and the tokens to generate."""
    if args.tiny:
        return make_prompts(6, 5, 40, vocab), 8
    return make_prompts(48, 16, 1200, vocab) + make_prompts(2, 3000, 3000, vocab, seed=1), 32


def generate(
    model_dir: Path, config: EngineConfig, prompts, max_tokens: int
) -> tuple[list[list[int]], float]:
    """Greedy outputs in prompt order (EOS ignored) and the seconds the timed run took (after a warm-up)."""
    engine = load_engine(str(model_dir), config)
    check_graphs_captured(engine, config)
    outputs, seconds = timed_generate(engine, prompts, max_tokens)
    del engine
    release(config.device)
    return outputs, seconds


def check_graphs_captured(engine, config: EngineConfig) -> None:
    captured = getattr(engine.runner, "graphs", None) is not None
    if (
        config.device == "cuda"
        and config.cuda_graphs
        and config.kernels in ("auto", "triton")
        and not captured
    ):
        raise RuntimeError(
            "CUDA graphs were asked for with the Triton kernels but none were captured (see the log)"
        )


def timed_generate(engine, prompts, max_tokens: int) -> tuple[list[list[int]], float]:
    """On a loaded engine: a warm-up, then every prompt greedy to exactly max_tokens, timed."""
    device = engine.runner.device.type
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    engine.generate(
        [EngineRequest(f"warm{i}", p, SamplingParams(max_tokens=4)) for i, p in enumerate(prompts[:8])]
    )
    sync(device)
    t0 = time.perf_counter()
    outputs = engine.generate([EngineRequest(f"r{i}", p, params) for i, p in enumerate(prompts)])
    sync(device)
    seconds = time.perf_counter() - t0
    for out in outputs:
        if out.error or len(out.output_token_ids) != max_tokens:
            raise RuntimeError(f"{out.request_id}: {len(out.output_token_ids)} tokens, error={out.error!r}")
    return [list(o.output_token_ids) for o in outputs], seconds


def judge(model_dir: Path, prompts, outputs_by_system: dict, args, **hf_options) -> dict:
    """Each generated token's fp32 regret: best fp32 logit minus the chosen token's, per system
    (`exact`: tokens that are the fp32 argmax itself). hf_options: more from_pretrained keywords."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, **hf_dtype(torch.float32), **hf_options)
    model = model.to(args.device).eval()
    verdicts = {}
    for system, outputs in outputs_by_system.items():
        regrets = []
        with torch.inference_mode():
            for prompt, out in zip(prompts, outputs, strict=True):
                ids = torch.tensor([prompt + out[:-1]], device=args.device)
                logits = model(ids).logits[0, len(prompt) - 1 :].float()
                chosen = logits.gather(1, torch.tensor(out, device=args.device)[:, None]).squeeze(1)
                regrets.extend((logits.max(dim=1).values - chosen).tolist())
        bad = sum(r > args.tie_tolerance for r in regrets)
        verdicts[system] = {"tokens": len(regrets), "beyond_tie": bad, "max_regret": max(regrets, default=0.0),
                            "exact": sum(r <= 0 for r in regrets),
                            "ok": bad <= args.max_bad_fraction * len(regrets)}  # fmt: skip
        print(f"{system:<12} {len(regrets)} tokens judged by fp32 transformers: {bad} beyond a "
              f"{args.tie_tolerance} tie, max regret {verdicts[system]['max_regret']:.3g}", flush=True)  # fmt: skip
    del model
    release(args.device)
    return verdicts


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    identical = sum(x == y for x, y in zip(a, b, strict=True))
    prefix = [
        next((i for i, (s, t) in enumerate(zip(x, y, strict=True)) if s != t), len(x)) / max(1, len(x))
        for x, y in zip(a, b, strict=True)
    ]
    return {
        "identical_sequences": identical,
        "sequences": len(a),
        "mean_common_prefix": sum(prefix) / len(prefix),
    }


def check_numerics(args, model_dir: Path, prompts, max_tokens) -> tuple[dict, bool]:
    outputs = {}
    for kernels in ("triton", "reference"):
        outputs[kernels], seconds = generate(
            model_dir, engine_config(args, kernels=kernels), prompts, max_tokens
        )
        print(f"{kernels}: {len(prompts)} requests in {seconds:.2f}s", flush=True)
    same = agreement(outputs["triton"], outputs["reference"])
    print(f"triton vs reference: {same['identical_sequences']}/{same['sequences']} sequences identical, "
          f"mean common prefix {same['mean_common_prefix']:.0%}", flush=True)  # fmt: skip
    verdicts = judge(model_dir, prompts, outputs, args)
    ok = all(v["ok"] for v in verdicts.values())
    if args.dtype == "float32":  # no bf16 near-ties: the two must agree exactly
        ok &= same["identical_sequences"] == same["sequences"]
    return {"agreement": same, "judged": verdicts}, ok


def check_graphs(args, model_dir: Path, prompts, max_tokens) -> tuple[dict | None, bool]:
    outputs, seconds = {}, {}
    for label, on in (("graphs", True), ("eager", False)):
        config = engine_config(args, kernels="auto", cuda_graphs=on)
        if config is None:
            return None, False
        outputs[label], seconds[label] = generate(model_dir, config, prompts, max_tokens * 2)
        tps = len(prompts) * max_tokens * 2 / seconds[label]
        print(f"{label}: {seconds[label]:.2f}s, {tps:.0f} generated tok/s", flush=True)
    same = agreement(outputs["graphs"], outputs["eager"])
    print(f"graphs vs eager: {same['identical_sequences']}/{same['sequences']} sequences identical, "
          f"mean common prefix {same['mean_common_prefix']:.0%}", flush=True)  # fmt: skip
    verdicts = judge(model_dir, prompts, outputs, args)
    figures = {
        "agreement": same,
        "judged": verdicts,
        "seconds": seconds,
        "speedup": seconds["eager"] / seconds["graphs"],
    }
    return figures, all(v["ok"] for v in verdicts.values())


def check_memory(args, model_dir: Path, vocab: int) -> tuple[dict, bool]:
    cuda = args.device == "cuda"
    free_before = torch.cuda.mem_get_info()[0] if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    config = EngineConfig(device=args.device, dtype=args.dtype)  # every sizing choice left to the engine
    engine = load_engine(str(model_dir), config)
    runner = engine.runner
    figures = {
        "limits": engine.limits.as_dict(),  # what the engine chose for this device, and the KV cache it sized
        "block_size": engine.config.block_size,
        "max_model_len": engine.max_model_len,
        "kv_blocks": getattr(runner, "num_blocks", "not available"),
        "kv_cache_gib": _gib(runner.kv_cache.data.nbytes) if hasattr(runner, "kv_cache") else "not available",
        "free_gib_before": _gib(free_before),
        "peak_gib_while_sizing": _gib(torch.cuda.max_memory_allocated()) if cuda else None,
        "free_gib_after_sizing": _gib(torch.cuda.mem_get_info()[0]) if cuda else None,
    }  # fmt: skip
    print(json.dumps(figures, indent=2), flush=True)
    budget = engine.limits.max_num_batched_tokens
    prompt_len = max(2, min(budget // 4, engine.max_model_len - 8))
    prompts = make_prompts(4, prompt_len, prompt_len, vocab, seed=2)
    score_prompt = make_prompts(1, min(1000, prompt_len), min(1000, prompt_len), vocab, seed=3)[0]
    continuations = make_prompts(2, 200, 200, vocab, seed=4)
    requests = [
        EngineRequest(f"full{i}", p, SamplingParams(max_tokens=4, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]
    requests.append(EngineRequest("score", score_prompt, continuations=continuations))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        allocated = torch.cuda.memory_allocated()
    ok = True
    try:
        outputs = engine.generate(requests)
        errors = [o.error for o in outputs if o.error]
        ok = not errors
        figures["full_budget_step"] = {"budget_tokens": budget, "prompts": f"4 x {prompt_len} + scoring 2 x 200",
                                       "errors": errors}  # fmt: skip
        if cuda:
            figures["full_budget_step"]["peak_extra_gib"] = _gib(
                torch.cuda.max_memory_allocated() - allocated
            )
            figures["full_budget_step"]["free_gib_after"] = _gib(torch.cuda.mem_get_info()[0])
    except torch.OutOfMemoryError as exc:
        ok = False
        figures["full_budget_step"] = {"budget_tokens": budget, "error": f"out of memory: {exc}"[:400]}
    print(json.dumps(figures["full_budget_step"], indent=2), flush=True)
    return figures, ok


def figure(check: str, figures: dict) -> str:
    """The one line a reader of gpu_check's summary needs from this check."""
    if check == "memory":
        return f"KV cache {figures.get('kv_cache_gib')} GiB; profiled: {figures['limits'].get('profile_step') or 'n/a'}"
    same = figures["agreement"]
    text = f"{same['identical_sequences']}/{same['sequences']} sequences identical"
    if check == "graphs":
        text += f", graphs {figures['speedup']:.2f}x eager"
    judged = ", ".join(
        f"{k} {v['beyond_tie']}/{v['tokens']} beyond a tie" for k, v in figures["judged"].items()
    )
    return f"{text}; {judged}"


def _gib(n):
    return None if n is None else round(n / GIB, 2)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_engine_check: error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    shape = TINY if args.tiny else CHECK
    with tempfile.TemporaryDirectory(prefix="bulkrun-engine-check-") as tmp:
        model_dir = Path(tmp)
        build_model_dir(shape, getattr(torch, args.dtype), args.device, model_dir, max_positions=8192)
        prompts, max_tokens = workload(args, shape.vocab)
        print(f"{args.check}: {shape} {args.dtype} on {args.device}, {len(prompts)} prompts", flush=True)
        if args.check == "numerics":
            figures, ok = check_numerics(args, model_dir, prompts, max_tokens)
        elif args.check == "graphs":
            figures, ok = check_graphs(args, model_dir, prompts, max_tokens)
            if figures is None:
                return NOT_AVAILABLE
        else:
            figures, ok = check_memory(args, model_dir, shape.vocab)
    figures["ok"] = ok
    print(f"FIGURE: {figure(args.check, figures)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    print(f"{args.check}: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
