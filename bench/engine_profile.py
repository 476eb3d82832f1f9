"""Where an engine run's time goes (bf16 unless --dtype says otherwise), op by op: the default model on vllm_peer_bench's two workloads
(prompt-heavy: 48 chat prompts of 50-400 tokens; decode-heavy: 512 short tickets; 64 new tokens
each), in-process, after a warm-up run, under torch's profiler.

    python bench/engine_profile.py [--workload prompt-heavy|decode-heavy|both] [--no-batch-invariant] [--cold]

Prints, per workload, the wall time and each op group's share of it (linears, attention, norms,
...), with GFLOP/s for the linears against this box's measured bf16 GEMM rate; what no op accounts
for is the host's part (Python, scheduling, step building). Then the steps that carried prompt
tokens and the decode-only ones: how many, their time, the median step. The op times are the
calling thread's wall time inside each op (the ops run their own intra-op threads), so the shares
add up to the wall.
"""

from __future__ import annotations

import argparse
import bisect
import time
from collections import defaultdict

import torch
from torch.autograd.profiler import record_function
from workload import chat_prompts, matmul_gflops, matmul_params

NEW_TOKENS = 64
STEP_MARK = "bulkrun.step_end:"
# op name (as the profiler records it) -> group
GROUPS = {
    "mkldnn::_linear_pointwise": "linears",
    "bulkrun_cpu::amx_gemm": "linears",
    "bulkrun_cpu::dpbf16_gemm": "linears",
    "bulkrun_cpu::small_gemm": "linears",
    # the GEMMs with an op in their epilogue: that op's time counts as the linears' (AMX boxes)
    "bulkrun_cpu::amx_gemm_gated": "linears",
    "bulkrun_cpu::amx_gemm_qkv": "linears",
    "aten::addmm": "linears",
    "aten::mm": "linears",
    "aten::linear": "linears",
    "bulkrun_cpu::paged_attention": "attention",
    "bulkrun_cpu::rms_norm": "norms",
    "bulkrun_cpu::rotary": "rotary",
    "bulkrun_cpu::silu_and_mul": "activation",
    "bulkrun_cpu::gelu_tanh_and_mul": "activation",
    "bulkrun_cpu::write_kv": "kv write",
    "bulkrun_cpu::greedy_head": "greedy head",
    "bulkrun_cpu::greedy_head_int8": "greedy head",
    "bulkrun_cpu::greedy_head_vnni": "greedy head",
}


def profile(engine, prompts: list[list[int]], warm_prompts: list[list[int]] | None):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from bulkrun.engine.core.params import EngineRequest, SamplingParams

    def requests(tag, token_lists):
        return [
            EngineRequest(f"{tag}{i}", p, SamplingParams(max_tokens=NEW_TOKENS))
            for i, p in enumerate(token_lists)
        ]

    # a warm-up run first, of other prompts of the same lengths (the same ones would hit the prefix
    # cache): what a long job's later steps see
    if warm_prompts is not None:
        list(engine.stream(requests("warm", warm_prompts)))
    steps: dict[str, list[float]] = {"with prompt tokens": [], "decode only": []}
    last = [0.0]

    def on_step(stats) -> None:  # each step's time: since the previous step ended
        now = time.perf_counter()
        kind = "with prompt tokens" if stats.num_prefill_tokens else "decode only"
        steps[kind].append(now - last[0])
        last[0] = now
        with record_function(f"{STEP_MARK}{kind}"):  # the step's end on the profiler's clock
            pass

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = last[0] = time.perf_counter()
        outputs = list(engine.stream(requests("run", prompts), on_step=on_step))
        wall = time.perf_counter() - t0
    groups: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        groups[GROUPS.get(event.key, "other torch ops")] += event.self_cpu_time_total / 1e6
    return (
        wall,
        dict(groups),
        sum(len(o.output_token_ids) for o in outputs),
        sum(o.num_cached_tokens for o in outputs),
        steps,
        by_step_kind(prof.events()),
    )


def by_step_kind(events) -> dict[str, dict[str, float]]:
    """Each op's self time (s) by group, binned into the kind of step it ran in (by the step end marks)."""
    marks = sorted(
        (e.time_range.start, e.name[len(STEP_MARK) :]) for e in events if e.name.startswith(STEP_MARK)
    )
    ends = [t for t, _ in marks]
    split: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for event in events:
        if event.name.startswith(STEP_MARK):
            continue
        i = bisect.bisect_left(ends, event.time_range.start)
        if i < len(marks):
            split[marks[i][1]][GROUPS.get(event.name, "other torch ops")] += event.self_cpu_time_total / 1e6
    return split


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=["prompt-heavy", "decode-heavy", "both"], default="both")
    parser.add_argument("--no-batch-invariant", action="store_true")
    parser.add_argument("--cold", action="store_true", help="profile the first run (what a fresh job sees)")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="bfloat16",
                        help="auto: bulkrun's default on this CPU")  # fmt: skip
    args = parser.parse_args()

    from transformers import AutoConfig, AutoTokenizer

    from bulkrun.engine.core.config import EngineConfig
    from bulkrun.engine.load import load_engine
    from bulkrun.model_source import resolve_model
    from bulkrun_kernels.cpu_dtype import default_cpu_dtype

    model = str(resolve_model(None))
    tokenizer = AutoTokenizer.from_pretrained(model)
    dtype = str(default_cpu_dtype()).removeprefix("torch.") if args.dtype == "auto" else args.dtype
    engine = load_engine(model, EngineConfig(dtype=dtype, batch_invariant=not args.no_batch_invariant))
    body_params, head_params = matmul_params(AutoConfig.from_pretrained(model))
    gemm = matmul_gflops(n=2048, dtype=getattr(torch, dtype))
    print(f"box: {dtype} GEMM {gemm:.0f} GFLOP/s (best of up to 15 at 2048^3); "
          f"batch invariant: {not args.no_batch_invariant}")  # fmt: skip
    workloads = {"prompt-heavy": (48, 50, 400), "decode-heavy": (512, 20, 80)}
    for name, (n, lo, hi) in workloads.items():
        if args.workload not in (name, "both"):
            continue
        prompts = chat_prompts(tokenizer, n, lo, hi)
        warm = None if args.cold else chat_prompts(tokenizer, n, lo, hi, seed=1)
        wall, groups, generated, cached, steps, split = profile(engine, prompts, warm)
        prompt_tokens = sum(map(len, prompts))
        print(
            f"\n{name}: {n} prompts, {prompt_tokens} prompt tokens ({cached} from the prefix cache), "
            f"{generated} generated, wall {wall:.2f} s"
        )
        accounted = sum(groups.values())
        rows = sorted(groups.items(), key=lambda kv: -kv[1]) + [("host (no op)", max(0.0, wall - accounted))]
        for group, seconds in rows:
            extra = ""
            if group == "linears":
                # every computed token through the layers, the generated ones through the LM head
                flops = 2.0 * ((prompt_tokens - cached + generated) * body_params + generated * head_params)
                rate = flops / seconds / 1e9
                extra = f"  {rate:6.0f} GFLOP/s = {rate / gemm:5.1%} of the {dtype} GEMM rate"
            print(f"  {group:16s} {seconds:7.2f} s  {seconds / wall:6.1%}{extra}")
        for kind, times in steps.items():
            if times:
                print(
                    f"  steps {kind}: {len(times)}, {sum(times):.2f} s, "
                    f"median {sorted(times)[len(times) // 2] * 1e3:.1f} ms"
                )
                ops = sorted(split[kind].items(), key=lambda kv: -kv[1])
                per_step = [(g, s / len(times) * 1e3) for g, s in ops]
                per_step.append(
                    ("host (no op)", max(0.0, sum(times) / len(times) * 1e3 - sum(ms for _, ms in per_step)))
                )
                print("    a step: " + ", ".join(f"{g} {ms:.1f} ms" for g, ms in per_step))


if __name__ == "__main__":
    main()
