"""Compile every Triton kernel for Hopper (sm_90) without a GPU, in the configurations the wrappers
pick: the real compiler (ttir -> ttgir -> llir -> ptx -> cubin via ptxas) catches what the
interpreter cannot (types of loop-carried values, tl.dot shape limits, register/shared-memory blowups).

Run as a script in a process WITHOUT TRITON_INTERPRET (test_hopper_compile.py does that). Each wrapper
runs on CPU tensors with its launches intercepted; for each launch we compute the cache key Triton's
own launcher would (its binder: argument types, the 1 / multiple-of-16 specialization of integers, the
16-byte alignment of pointers, constexprs) and compile each distinct key for the target once.

The wrappers are called over a sweep of what changes from step to step during a run (batch size,
token count, block-table width, partition count, context lengths). A *variant* is a kernel with one
set of constexprs and tensor dtypes (chosen on purpose by the wrapper); the run must give ONE cache key per variant,
or Triton would compile again in the middle of a run. Prints `ok <kernel> <variant> shared=<bytes>`
per compiled binary, then `variants=<n> binaries=<n>`; exits 1 with the offending keys otherwise.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature

from bulkrun_kernels import activation, kv_write, paged_attention, rmsnorm, rotary

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
MODULES = (activation, kv_write, paged_attention, rmsnorm, rotary)


class Launch:
    """One intercepted launch: Triton's cache key for it, and what compiling it needs."""

    def __init__(self, kernel: JITFunction, args, kwargs):
        self.kernel = kernel
        binder = create_function_from_signature(kernel.signature, kernel.params, BACKEND)
        self.bound, self.specialization, self.options = binder(*args, **kwargs)
        self.key = compute_cache_key({}, self.specialization, self.options)
        constexprs = [(p.name, self.bound[p.name]) for p in kernel.params if p.is_constexpr]
        dtypes = [s[0] for s in self.specialization if str(s[0]).startswith("*")]  # tensor dtypes
        self.variant = (
            kernel.fn.__name__,
            tuple(constexprs),
            tuple(dtypes),
            tuple(sorted(self.options.items())),
        )

    def compile(self):
        _, signature, constexprs, attrs = self.kernel._pack_args(
            BACKEND, dict(self.options), self.bound, self.specialization, dict(self.options)
        )
        source = ASTSource(self.kernel, signature, constexprs, attrs)
        return triton.compile(source, target=TARGET, options=dict(self.options))


class Recorder:
    """Replace every Triton kernel's launch in our kernel modules with a recorder (CPU tensors:
    nothing runs; we want the arguments)."""

    def __init__(self):
        self.launches: list[Launch] = []
        for module in MODULES:
            module.check_runnable = lambda *a: None
            for value in vars(module).values():
                if isinstance(value, JITFunction):
                    value.run = self._recorder(value)

    def _recorder(self, kernel):
        def record(*args, grid, warmup, **kwargs):
            self.launches.append(Launch(kernel, args, kwargs))

        return record


def attention_step(num_tokens, num_seqs, hq, hkv, d, dtype, table_width, num_partitions=None, **extras):
    """One attention call with a runner-like batch: the block table's width and batch size vary."""
    q = torch.zeros(num_tokens, hq, d, dtype=dtype)
    cache = torch.zeros(8, 16, hkv, d, dtype=dtype)
    tables = torch.zeros(num_seqs, table_width, dtype=torch.int32)
    qsl = torch.zeros(num_seqs + 1, dtype=torch.int32)
    seq_lens = torch.zeros(num_seqs, dtype=torch.int32)
    paged_attention.paged_attention(
        q, cache, cache, tables, qsl, seq_lens, 0.1, num_partitions=num_partitions, **extras
    )


def model_step(num_tokens, hidden=2048, hq=32, hkv=8, d=64, inter=8192, dtype=torch.bfloat16):
    """The other kernels of a layer as the model calls them (q/k are views of a fused qkv output)."""
    x = torch.zeros(num_tokens, hidden, dtype=dtype)
    rmsnorm.rms_norm(x, torch.ones(hidden, dtype=dtype), 1e-5, torch.zeros_like(x))
    rmsnorm.rms_norm(x, torch.ones(hidden, dtype=dtype), 1e-5)
    qkv = torch.zeros(num_tokens, (hq + 2 * hkv) * d, dtype=dtype)
    q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
    q, k, v = q.view(num_tokens, hq, d), k.view(num_tokens, hkv, d), v.view(num_tokens, hkv, d)
    rotary.rotary(q, k, torch.zeros(num_tokens, dtype=torch.int64), torch.zeros(4096, d, dtype=dtype), q, k)
    cache = torch.zeros(8, 16, hkv, d, dtype=dtype)
    kv_write.write_kv(k, v, cache, cache, torch.zeros(num_tokens, dtype=torch.int64))
    activation.silu_and_mul(torch.zeros(num_tokens, 2 * inter, dtype=dtype))
    activation.gelu_tanh_and_mul(torch.zeros(num_tokens, 2 * inter, dtype=dtype))


def sweep():
    """Steps of a run: decode batches of every size, mixed and prefill steps, block tables of every
    width (1, 16, 17, 32, ...: what Triton would otherwise specialize on), split and unsplit."""
    bf16, f32 = torch.bfloat16, torch.float32
    for num_seqs in (1, 2, 3, 16, 17, 64, 256, 1024):
        for width in (1, 2, 16, 17, 32, 33, 64, 512):
            attention_step(num_seqs, num_seqs, 32, 8, 64, bf16, width)  # decode, planned partitions
            attention_step(num_seqs, num_seqs, 32, 8, 128, bf16, width, num_partitions=1)
    for num_partitions in (2, 3, 16, 32):  # every partition count shares the split binaries
        attention_step(4, 4, 32, 8, 128, bf16, 8, num_partitions=num_partitions)
        attention_step(32, 32, 32, 8, 128, bf16, 64, num_partitions=num_partitions)
    for num_tokens, num_seqs, width in ((2048, 1, 128), (2048, 7, 40), (4096, 16, 257), (1024, 3, 16)):
        attention_step(num_tokens, num_seqs, 32, 8, 64, bf16, width)  # prefill-heavy blocks
        attention_step(num_tokens, num_seqs, 32, 8, 128, bf16, width)
    # fp32 with GQA 8 and an odd head_dim, fp16 with MQA: the other dtypes and groups compile too
    attention_step(4, 4, 16, 2, 24, f32, 3)
    attention_step(40, 4, 16, 1, 64, torch.float16, 5, num_partitions=4)
    # a layer's window is a runtime argument: every window shares the binary of no window
    for window in (1, 16, 127, 128, 512, 4096):
        attention_step(17, 17, 32, 8, 64, bf16, 33, window=window)
        attention_step(2048, 7, 32, 8, 64, bf16, 40, window=window)
    # sinks (gpt-oss) and soft-capping (Gemma 2): one binary each, whatever the values
    for value in (0.5, 30.0, 50.0):
        attention_step(16, 16, 32, 8, 64, bf16, 16, sinks=torch.full((32,), value), window=128)
        attention_step(16, 16, 16, 8, 256, bf16, 16, softcap=value, window=4096)
    for num_tokens in (1, 2, 16, 17, 100, 1024, 2048):
        model_step(num_tokens)
        # Phi-4-mini: 96 of each 128-dim head rotated, the rest copied through
        q, k = torch.zeros(num_tokens, 24, 128, dtype=bf16), torch.zeros(num_tokens, 8, 128, dtype=bf16)
        rotary.rotary(q, k, torch.zeros(num_tokens, dtype=torch.int64), torch.zeros(4096, 96, dtype=bf16))


def main() -> int:
    recorder = Recorder()
    sweep()
    keys = defaultdict(set)
    first = {}
    for launch in recorder.launches:
        keys[launch.variant].add(launch.key)
        first.setdefault((launch.variant, launch.key), launch)
    bad = {variant: k for variant, k in keys.items() if len(k) > 1}
    if bad:
        for (name, constexprs, dtypes, _), k in bad.items():
            print(f"RECOMPILES {name} {dict(constexprs)} {dtypes}: {len(k)} cache keys", flush=True)
            for key in sorted(k):
                print(f"    {key}", flush=True)
        return 1
    for (variant, _key), launch in first.items():
        compiled = launch.compile()
        name, constexprs, dtypes, _ = variant
        assert compiled.asm.get("cubin"), f"{name}: no cubin"
        print(
            f"ok {name} {dict(constexprs)} {','.join(dtypes)} shared={compiled.metadata.shared}", flush=True
        )
    print(f"variants={len(keys)} binaries={len(first)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
