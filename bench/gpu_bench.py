"""GPU benchmark: bulkrun's engine against transformers' `generate_batch` on identical work.

The model is built from a config with random weights, shaped like Llama-3.2-1B (--shape 1b: hidden
2048, 16 layers, 32 heads, 8 kv heads, intermediate 8192, vocab 128256, tied embeddings) or
Llama-3.1-8B (--shape 8b: hidden 4096, 32 layers, 32/8 heads, intermediate 14336, untied); plain rope,
no llama3 rope scaling; saved with a locally built word-level tokenizer into a temp dir: no hub access.
Both systems get the same prompts (random token ids, lengths spread evenly over [--prompt-min,
--prompt-max]), greedy decoding, exactly --output-len new tokens each (EOS ignored), each after an
untimed warm-up. Printed: tokens/s of both, the ratio, the engine's fraction of this machine's
measured matmul rate, how often both chose the same first token and the same whole sequence (bf16:
near-ties may differ; gpu_engine_check.py judges tokens properly), and with --profile, a few
decode-only steps: wall time vs device busy time per step, and the top kernels.

    python bench/gpu_bench.py                         # CUDA, bf16, the 1B shape (what gpu_check.sh runs)
    python bench/gpu_bench.py --device cpu --tiny     # the same code paths on a tiny model, on the CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_model import SHAPES, build_model_dir, hf_dtype, make_prompts  # noqa: E402


def fail(message: str, code: int = 2) -> None:
    print(f"gpu_bench: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


@dataclass
class Result:
    system: str
    requests: int
    prompt_tokens: int
    generated_tokens: int
    seconds: float  # timed run, warm-up excluded
    wall_seconds: float  # the whole timed call (for transformers: including its own per-call warm-up)
    outputs: list[list[int]] = field(repr=False, default_factory=list)

    @property
    def gen_tps(self) -> float:
        return self.generated_tokens / self.seconds

    @property
    def total_tps(self) -> float:
        return (self.prompt_tokens + self.generated_tokens) / self.seconds


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--shape", default="1b", choices=["1b", "8b"], help="the random model's shape")
    p.add_argument("--tiny", action="store_true", help="tiny model and workload: a smoke run of every path")
    p.add_argument("--num-prompts", type=int, default=None, help="default 512 (tiny: 6)")
    p.add_argument("--prompt-min", type=int, default=None, help="default 64 (tiny: 5)")
    p.add_argument("--prompt-max", type=int, default=None, help="default 512 (tiny: 40)")
    p.add_argument("--output-len", type=int, default=None, help="default 256 (tiny: 6)")
    p.add_argument(
        "--dtype", default=None, choices=["bfloat16", "float16", "float32"], help="default: bf16 on CUDA"
    )
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: the engine's choice")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the engine's choice")
    p.add_argument("--kernels", default="auto", choices=["auto", "triton", "reference"])
    p.add_argument("--skip-hf", action="store_true", help="run the engine only")
    p.add_argument("--min-agreement", type=float, default=0.5, help="fail below this first-token agreement")
    p.add_argument("--profile", action="store_true", help="print the top kernels of a few decode steps")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    tiny = {"num_prompts": 6, "prompt_min": 5, "prompt_max": 40, "output_len": 6}
    full = {"num_prompts": 512, "prompt_min": 64, "prompt_max": 512, "output_len": 256}
    for name, value in (tiny if args.tiny else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    if not 1 <= args.prompt_min <= args.prompt_max:
        fail(f"need 1 <= --prompt-min <= --prompt-max, got {args.prompt_min}, {args.prompt_max}")
    return args


def check_environment(device: str) -> None:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        fail(f"missing package: {exc.name} (the bench needs torch and transformers)")
    if device == "cuda" and not torch.cuda.is_available():
        fail(
            f"--device cuda but torch sees no CUDA device (torch {torch.__version__}); use --device cpu --tiny"
        )
    try:
        import bulkrun.engine.load  # noqa: F401
    except ImportError as exc:
        fail(
            f"cannot import the bulkrun engine ({exc}); run from the repo root with it installed or on PYTHONPATH"
        )


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def free_memory(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run_engine(model_dir: Path, prompts: list[list[int]], args) -> Result:
    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.core.params import EngineRequest, SamplingParams

    limits = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    config = EngineConfig(
        device=args.device,
        dtype=args.dtype,
        kernels=args.kernels,
        enable_prefix_caching=False,  # random prompts share nothing; keep the work identical to the peer's
        **{k: v for k, v in limits.items() if v is not None},  # unset: the engine sizes for the device
    )
    from bulkrun.engine.load import load_engine

    engine = load_engine(str(model_dir), config)
    print(f"engine limits: {engine.limits.as_dict()}", flush=True)

    def requests(batch, max_tokens, tag):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return [EngineRequest(f"{tag}{i}", p, params) for i, p in enumerate(batch)]

    # Warm-up: prompt chunks and decode rows both (compiles every kernel variant once).
    engine.generate(requests(prompts[: min(len(prompts), 16)], 4, "warm"))
    synchronize(args.device)
    totals = StepTotals()
    t0 = time.perf_counter()
    by_id = {
        o.request_id: o for o in engine.stream(requests(prompts, args.output_len, "r"), on_step=totals.add)
    }
    synchronize(args.device)
    elapsed = time.perf_counter() - t0
    outputs = [by_id[f"r{i}"] for i in range(len(prompts))]
    totals.print(elapsed)
    for out in outputs:
        if out.finish_reason != "length" or len(out.output_token_ids) != args.output_len:
            fail(
                f"engine request {out.request_id}: finish_reason={out.finish_reason!r}, "
                f"{len(out.output_token_ids)} tokens (wanted {args.output_len}), error={out.error!r}",
                code=3,
            )
    tokens = [list(o.output_token_ids) for o in outputs]
    profile = profile_decode_steps(engine, prompts, args) if args.profile else None
    del engine
    free_memory(args.device)
    result = Result(
        "bulkrun", len(prompts), sum(map(len, prompts)), sum(map(len, tokens)), elapsed, elapsed, tokens
    )
    return result, profile


class StepTotals:
    """Sums of the engine's per-step figures (StepStats, from Engine.stream's on_step)."""

    def __init__(self):
        self.steps = self.scheduled = self.prefill = self.decode = self.preempted = 0

    def add(self, stats) -> None:
        self.steps += 1
        self.scheduled += stats.num_scheduled_tokens
        self.prefill += stats.num_prefill_tokens
        self.decode += stats.num_decode_tokens
        self.preempted += stats.num_preempted

    def print(self, seconds: float) -> None:
        steps = max(1, self.steps)
        print(f"engine: {self.steps} steps, {self.scheduled / steps:.0f} tokens/step ({self.prefill} prefill, "
              f"{self.decode} decode), {self.preempted} preemptions, {1000 * seconds / steps:.1f} ms/step",
              flush=True)  # fmt: skip


def profile_decode_steps(engine, prompts: list[list[int]], args, steps: int = 8) -> dict:
    """A few steady decode-only steps (a full batch decoding): wall time per step against the time the
    device was busy with kernels (the rest is the device waiting on the host), and the top kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from bulkrun.engine.core.params import EngineRequest, SamplingParams

    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    for i, p in enumerate(prompts[: engine.limits.max_num_seqs]):
        engine.add_request(EngineRequest(f"prof{i}", p, params))
    while engine.last_stats.num_prefill_tokens or engine.last_stats.num_scheduled_tokens == 0:
        engine.step()  # until every prompt is in and steps are decode-only
    engine.step()
    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(args.device)
    t0 = time.perf_counter()  # wall time unprofiled: tracing slows the host side
    for _ in range(steps):
        engine.step()
    synchronize(args.device)
    wall = (time.perf_counter() - t0) / steps
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        synchronize(args.device)
    busy = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    busy = busy / 1e6 / steps if cuda else None
    batch = engine.last_stats.num_running
    print(f"\nprofile of {steps} decode-only steps at batch {batch}: {1000 * wall:.2f} ms/step wall"
          + (f", device busy {1000 * busy:.2f} ms ({busy / wall:.0%}); host-bound gap {1000 * (wall - busy):.2f} ms"
             if cuda else " (device busy: n/a on the CPU)"))  # fmt: skip
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=60), flush=True)
    return {"steps": steps, "batch": batch, "wall_ms_per_step": 1000 * wall,
            "device_busy_ms_per_step": None if busy is None else 1000 * busy,
            "device_busy_fraction": None if busy is None else busy / wall}  # fmt: skip


def run_transformers(model_dir: Path, prompts: list[list[int]], args) -> Result:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, **hf_dtype(dtype)).to(args.device).eval()
    # eos_token_id=-1 disables EOS: every request makes exactly max_new_tokens.
    gen = GenerationConfig(max_new_tokens=args.output_len, do_sample=False, eos_token_id=-1, pad_token_id=0)
    warm = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
    model.generate_batch(inputs=prompts[: min(len(prompts), 16)], generation_config=warm, progress_bar=False)
    synchronize(args.device)
    t0 = time.perf_counter()
    results = model.generate_batch(inputs=prompts, generation_config=gen, progress_bar=False)
    synchronize(args.device)
    wall = time.perf_counter() - t0
    outs = list(results.values())
    if len(outs) != len(prompts):
        fail(f"generate_batch returned {len(outs)} results for {len(prompts)} prompts", code=3)
    for out in outs:
        if getattr(out, "error", None) or len(out.generated_tokens) != args.output_len:
            fail(
                f"generate_batch {out.request_id}: {len(out.generated_tokens)} tokens, "
                f"error={getattr(out, 'error', None)!r}",
                code=3,
            )
    # generate_batch warms itself up inside every call; requests are created after that warm-up,
    # so first creation to last finish is its steady-state time.
    try:
        steady = max(o.lifespan[1] for o in outs) - min(o.created_time for o in outs)
    except (AttributeError, TypeError):
        steady = wall
    steady = steady if 0 < steady <= wall else wall
    tokens = [list(o.generated_tokens) for o in outs]
    del model, results
    free_memory(args.device)
    return Result("transformers generate_batch", len(prompts), sum(map(len, prompts)), sum(map(len, tokens)),
                  steady, wall, tokens)  # fmt: skip


def matmul_tflops(device: str, dtype_name: str) -> float:
    """This machine's own dense matmul rate in the bench dtype (median of a few products)."""
    import statistics

    import torch

    n = 8192 if device == "cuda" else 1024
    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(8):
        synchronize(device)
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        if i >= 2:  # the first products warm up
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e12


def first_token_agreement(a: Result, b: Result) -> float:
    same = sum(1 for x, y in zip(a.outputs, b.outputs, strict=True) if x[:1] == y[:1])
    return same / max(1, len(a.outputs))


def sequence_agreement(a: Result, b: Result) -> float:
    return sum(x == y for x, y in zip(a.outputs, b.outputs, strict=True)) / max(1, len(a.outputs))


def report(results: list[Result], config, args, peak_tflops: float) -> dict:
    from workload import model_flops_per_token

    mean_context = (args.prompt_min + args.prompt_max) / 2 + args.output_len / 2
    flops_per_token = model_flops_per_token(config, mean_context)
    base = results[-1].gen_tps
    print(f"\n{'system':<28} {'requests':>8} {'prompt tok':>10} {'gen tok':>8} {'seconds':>8} "
          f"{'gen tok/s':>10} {'total tok/s':>11} {'MFU':>6} {'ratio':>6}")  # fmt: skip
    rows = []
    for r in results:
        mfu = (r.prompt_tokens + r.generated_tokens) * flops_per_token / r.seconds / (peak_tflops * 1e12)
        print(f"{r.system:<28} {r.requests:>8} {r.prompt_tokens:>10} {r.generated_tokens:>8} {r.seconds:>8.2f} "
              f"{r.gen_tps:>10.0f} {r.total_tps:>11.0f} {mfu:>6.1%} {r.gen_tps / base:>5.2f}x")  # fmt: skip
        rows.append(
            {**{k: v for k, v in asdict(r).items() if k != "outputs"}, "gen_tps": r.gen_tps, "mfu": mfu}
        )
    figures = {"rows": rows, "matmul_tflops": peak_tflops, "args": {k: str(v) for k, v in vars(args).items()}}
    print(f"matmul rate measured here: {peak_tflops:.3g} TFLOP/s ({args.dtype}); MFU counts 2*params+attention "
          f"FLOPs per token; transformers' seconds exclude its per-call warm-up (wall: {results[-1].wall_seconds:.2f}s)")  # fmt: skip
    return figures


def main(argv=None) -> int:
    args = parse_args(argv)
    check_environment(args.device)
    import torch

    shape = SHAPES["tiny" if args.tiny else args.shape]
    print(f"gpu_bench: {shape} {args.dtype} on {args.device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if args.device == 'cuda' else ''}; "
          f"{args.num_prompts} prompts of {args.prompt_min}-{args.prompt_max} tokens, {args.output_len} new each",
          flush=True)  # fmt: skip
    prompts = make_prompts(args.num_prompts, args.prompt_min, args.prompt_max, shape.vocab)
    with tempfile.TemporaryDirectory(prefix="bulkrun-gpu-bench-") as tmp:
        t0 = time.perf_counter()
        max_positions = max(4096, args.prompt_max + args.output_len + 16)
        config = build_model_dir(shape, getattr(torch, args.dtype), args.device, Path(tmp), max_positions)
        print(f"random model saved in {time.perf_counter() - t0:.1f}s", flush=True)
        engine_result, profile = run_engine(Path(tmp), prompts, args)
        results = [engine_result]
        print(f"bulkrun: {results[0].gen_tps:.0f} generated tok/s", flush=True)
        if not args.skip_hf:
            results.append(run_transformers(Path(tmp), prompts, args))
    figures = report(results, config, args, matmul_tflops(args.device, args.dtype))
    figures["decode_profile"] = profile
    code = 0
    if len(results) == 2:
        agreement = first_token_agreement(results[0], results[1])
        figures["first_token_agreement"] = agreement
        figures["sequence_agreement"] = sequence_agreement(results[0], results[1])
        print(f"greedy agreement with transformers: first token {agreement:.0%}, "
              f"whole sequence {figures['sequence_agreement']:.0%}")  # fmt: skip
        if agreement < args.min_agreement:
            print(
                f"gpu_bench: error: agreement below --min-agreement {args.min_agreement:.0%}", file=sys.stderr
            )
            code = 3
    ratio = f", {results[0].gen_tps / results[1].gen_tps:.2f}x transformers" if len(results) == 2 else ""
    print(f"FIGURE: {results[0].gen_tps:.0f} generated tok/s{ratio}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
