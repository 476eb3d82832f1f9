"""Families beyond Llama on the GPU (gpu_check.sh stages 08-09), each a random model of the family's
real layer shape (gpu_model.FAMILY_SHAPES), one per subcommand:

  gemma3     Gemma-3-1B's layers (sliding and global, head_dim 256, GeGLU, q/k norms): the engine's
             fp32 greedy on prompts longer than the window, every token judged by transformers' fp32
             forward of the same sequence; then the engine's bf16 throughput
  qwen3-moe  Qwen3-30B-A3B's layers (128 experts, top 8): the Triton fused MoE against the reference
             on the same inputs (fp32 and bf16, decode to prefill token counts); then fp32 greedy
             judged as above, and bf16 throughput

fp32 greedy passes when every token is within --tie-tolerance of transformers' best fp32 logit (the
engine's fp32 is exact IEEE, so only a true near-tie may go the other way). Phases write their
figures as they end (gpu_stage.Stage); throughput is skipped when the stage's time is short.
Exit status: 0 pass, 1 a check failed, 2 cannot run here.

    python bench/gpu_family_check.py gemma3 --device cuda --json out.json
    TRITON_INTERPRET=1 python bench/gpu_family_check.py qwen3-moe --device cpu --tiny   # smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import synchronize as sync  # noqa: E402
from gpu_engine_check import engine_config, generate, judge  # noqa: E402
from gpu_model import FAMILY_SHAPES, build_family_dir, make_prompts  # noqa: E402
from gpu_stage import Stage  # noqa: E402

THROUGHPUT_NEEDS_S = 8  # a bf16 engine's load, warm-up and timed run on the full shape (2-3 s on an H200)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("family", choices=["gemma3", "qwen3-moe"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="tiny model and workload (smoke run)")
    p.add_argument("--tie-tolerance", type=float, default=1e-3, help="fp32 logit gap counted as a tie")
    p.add_argument("--max-num-seqs", type=int, default=64, help="fewer CUDA graph sizes to capture")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"  # the throughput phase's
    args.max_bad_fraction = 0.0  # judge(): fp32 leaves no room beyond a tie
    args.shape = args.family.replace("-", "_") + ("-tiny" if args.tiny else "")
    return args


def check_moe_kernels(args, stage: Stage) -> None:
    """The Triton fused MoE (kernels/grouped_gemm.py) and the reference on the same routed tokens,
    both against the reference in fp32; timings at the largest count."""
    from bulkrun_kernels import reference
    from bulkrun_kernels.grouped_gemm import fused_moe

    fields = FAMILY_SHAPES[args.shape][1]
    e, h, k = fields["num_experts"], fields["hidden_size"], fields["num_experts_per_tok"]
    inter, dev = fields["moe_intermediate_size"], args.device
    g = torch.Generator(device=dev).manual_seed(0)
    w_gate_up = torch.randn(e, 2 * inter, h, generator=g, device=dev) * h**-0.5
    w_down = torch.randn(e, h, inter, generator=g, device=dev) * inter**-0.5
    experts = {dtype: (w_gate_up.to(dtype), w_down.to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    rows = []
    for tokens in [1, 5, 33] if args.tiny else [1, 7, 64, 512, 2048]:
        x = torch.randn(tokens, h, generator=g, device=dev)
        weights, ids = torch.softmax(torch.randn(tokens, e, generator=g, device=dev), -1).topk(k, -1)
        routed = (ids, weights / weights.sum(-1, keepdim=True))  # norm_topk_prob, as Qwen3-MoE
        want, want_counts = reference.fused_moe(x, *experts[torch.float32], *routed)
        for dtype, (up, down) in experts.items():
            inputs = (x.to(dtype), up, down, ids, routed[1].to(dtype))
            case = _moe_case(fused_moe(*inputs), reference.fused_moe(*inputs)[0], want, want_counts)
            rows.append({"tokens": tokens, "dtype": str(dtype)[6:], **case})
            print(f"fused_moe {tokens:>5} tokens {str(dtype)[6:]:<8} rel error {case['rel_error']:.2e} "
                  f"(reference {case['reference_rel_error']:.2e}){'' if case['ok'] else '  FAILED'}")  # fmt: skip
    repeats = 1 if args.tiny else 5
    times = {name: _median_ms(fn, inputs, dev, repeats)
             for name, fn in (("triton", fused_moe), ("reference", reference.fused_moe))}  # fmt: skip
    figures = {"shape": {"experts": e, "hidden": h, "intermediate": inter, "top_k": k}, "cases": rows,
               "bf16_ms_at_largest": times, "speedup": times["reference"] / times["triton"]}  # fmt: skip
    worst = max(r["rel_error"] for r in rows if r["dtype"] == "bfloat16")
    passed = sum(r["ok"] for r in rows)
    stage.done("moe_kernels", figures, passed == len(rows), f"fused MoE {passed}/{len(rows)} cases "
               f"(bf16 worst {worst:.1e}), {figures['speedup']:.1f}x the reference")  # fmt: skip


def _moe_case(triton_result, reference_out, want, want_counts) -> dict:
    """Errors relative to the fp32 output's largest entry; the expert counts must be exact."""
    got, counts = triton_result
    scale = want.abs().max().item()
    error = (got.float() - want).abs().max().item() / scale
    # fp32: IEEE dots in another order; bf16: rounding of inputs, hidden rows and outputs
    bound = 1e-5 if got.dtype == torch.float32 else 3e-2
    return {"rel_error": error, "reference_rel_error": (reference_out.float() - want).abs().max().item() / scale,
            "bound": bound, "ok": error <= bound and torch.equal(counts.cpu(), want_counts.cpu())}  # fmt: skip


def _median_ms(fn, inputs, device: str, repeats: int) -> float:
    fn(*inputs)  # compiled / warm
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn(*inputs)
        sync(device)
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def check_fp32_greedy(args, stage: Stage, model_dir: Path, config) -> None:
    """Prompts from just past the window to four windows (full-attention families: 512 stands in)."""
    import transformers

    window = getattr(config, "sliding_window", None) or 512
    prompts = make_prompts(4, window + window // 4, 4 * window, config.vocab_size, seed=5)
    max_tokens = 6 if args.tiny else 24
    engine = engine_config(args, dtype="float32", kernels="auto", max_num_seqs=16)
    outputs, seconds = generate(model_dir, engine, prompts, max_tokens)
    # transformers 5's MoE layers default to grouped GEMMs that fp32 may not have on the device (4.x
    # loops over the experts, and would pass the unknown keyword on to the model)
    moe = "moe" in args.shape and int(transformers.__version__.split(".")[0]) >= 5
    hf_options = {"experts_implementation": "eager"} if moe else {}
    verdict = judge(model_dir, prompts, {"engine fp32": outputs}, args, **hf_options)["engine fp32"]
    figures = {"prompt_lengths": [len(p) for p in prompts], "window": window, "seconds": seconds, **verdict}
    line = f"fp32 greedy {verdict['exact']}/{verdict['tokens']} tokens the fp32 argmax, {verdict['beyond_tie']} beyond a tie"
    stage.done("fp32_greedy", figures, verdict["ok"], line)


def check_throughput(args, stage: Stage, model_dir: Path, config) -> None:
    if not stage.fits("throughput", THROUGHPUT_NEEDS_S):
        return
    num, max_tokens = (6, 6) if args.tiny else (128, 64)
    window = getattr(config, "sliding_window", None) or 512
    prompts = make_prompts(num, 16, 2 * window, config.vocab_size, seed=6)
    engine = engine_config(args, kernels="auto")
    outputs, seconds = generate(model_dir, engine, prompts, max_tokens)
    tps = num * max_tokens / seconds
    total = (sum(map(len, prompts)) + num * max_tokens) / seconds
    figures = {"requests": num, "prompt_tokens": sum(map(len, prompts)), "generated_tokens": num * max_tokens,
               "seconds": seconds, "gen_tps": tps, "total_tps": total, "dtype": args.dtype}  # fmt: skip
    stage.done("throughput", figures, True, f"{args.dtype} {tps:.0f} generated tok/s ({total:.0f} total)")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_family_check: error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    stage = Stage(args.json)
    print(f"{args.family}: {FAMILY_SHAPES[args.shape][1]} on {args.device}", flush=True)
    if args.family == "qwen3-moe":
        check_moe_kernels(args, stage)
    with tempfile.TemporaryDirectory(prefix="bulkrun-family-check-") as tmp:
        model_dir = Path(tmp)
        # bf16 weights on the GPU (upcast exactly for the fp32 phases), fp32 on the CPU
        config = build_family_dir(args.shape, getattr(torch, args.dtype), args.device, model_dir, 8192)
        check_fp32_greedy(args, stage, model_dir, config)
        check_throughput(args, stage, model_dir, config)
    print(f"{args.family}: {'ok' if stage.ok else 'FAILED'}")
    return stage.exit_code()


if __name__ == "__main__":
    sys.exit(main())
