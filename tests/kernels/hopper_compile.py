"""Compile every Triton kernel for Hopper (sm_90) without a GPU, in the configurations the wrappers
pick: the real compiler (ttir -> ttgir -> llir -> ptx -> cubin via ptxas) catches what the
interpreter cannot (types of loop-carried values, tl.dot shape limits, register/shared-memory blowups).

Run as a script in a process WITHOUT TRITON_INTERPRET (test_hopper_compile.py does that). Each wrapper
runs on tiny CPU tensors with its launch intercepted: the captured arguments and constexprs are then
compiled for the target. Prints one line per case: `ok <case> shared=<bytes>`.
"""

from __future__ import annotations

import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type

from bulkrun_kernels import activation, kv_write, paged_attention, rmsnorm, rotary

TARGET = GPUTarget("cuda", 90, 32)


def capture(module, kernel_name: str, call):
    """Run `call()` with the kernel's launch replaced by a recorder; return (args, constexprs)."""
    kernel = getattr(module, kernel_name)
    seen = {}

    def record(*args, grid, warmup, **kwargs):
        seen.update(args=args, kwargs=kwargs)

    module.check_runnable = lambda *a: None  # CPU tensors: we only want the arguments
    kernel.run = record
    call()
    return kernel, seen["args"], seen["kwargs"]


def compile_case(name: str, module, kernel_name: str, call) -> None:
    kernel, args, kwargs = capture(module, kernel_name, call)
    constexprs = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages")}
    signature = {n: mangle_type(a) for n, a in zip(kernel.arg_names, args, strict=False)}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=TARGET, options=options)
    assert compiled.asm.get("cubin"), f"{name}: no cubin"
    print(f"ok {name} shared={compiled.metadata.shared}", flush=True)


def attention_call(num_tokens, num_seqs, hq, hkv, d, dtype):
    def call():
        q = torch.zeros(num_tokens, hq, d, dtype=dtype)
        cache = torch.zeros(4, 16, hkv, d, dtype=dtype)
        tables = torch.zeros(num_seqs, 4, dtype=torch.int32)
        qsl = torch.zeros(num_seqs + 1, dtype=torch.int32)
        seq_lens = torch.zeros(num_seqs, dtype=torch.int32)
        paged_attention.paged_attention(q, cache, cache, tables, qsl, seq_lens, 0.1)

    return call


def cases():
    bf16 = torch.bfloat16
    yield (
        "attention decode bf16 gqa4 d64",
        paged_attention,
        "_paged_attention_kernel",
        attention_call(8, 8, 32, 8, 64, bf16),
    )
    yield (
        "attention prefill bf16 gqa4 d128",
        paged_attention,
        "_paged_attention_kernel",
        attention_call(256, 2, 32, 8, 128, bf16),
    )
    yield (
        "attention decode fp32 group3 d24",
        paged_attention,
        "_paged_attention_kernel",
        attention_call(4, 4, 6, 2, 24, torch.float32),
    )
    yield (
        "attention mixed fp16 mqa16 d64",
        paged_attention,
        "_paged_attention_kernel",
        attention_call(40, 4, 16, 1, 64, torch.float16),
    )

    def kv():
        k = torch.zeros(4, 8, 64, dtype=bf16)
        cache = torch.zeros(4, 16, 8, 64, dtype=bf16)
        kv_write.write_kv(k, k, cache, cache, torch.zeros(4, dtype=torch.int64))

    yield "write_kv bf16", kv_write, "_write_kv_kernel", kv

    def norm():
        x = torch.zeros(4, 2048, dtype=bf16)
        rmsnorm.rms_norm(x, torch.ones(2048, dtype=bf16), 1e-5, torch.zeros_like(x))

    yield "rms_norm bf16 residual h2048", rmsnorm, "_rms_norm_kernel", norm

    def rope():
        q, k = torch.zeros(4, 32, 64, dtype=bf16), torch.zeros(4, 8, 64, dtype=bf16)
        rotary.rotary(q, k, torch.zeros(4, dtype=torch.int64), torch.zeros(128, 64, dtype=bf16))

    yield "rotary bf16 32/8 d64", rotary, "_rotary_kernel", rope

    def act():
        activation.silu_and_mul(torch.zeros(4, 2 * 8192, dtype=bf16))

    yield "silu_and_mul bf16 i8192", activation, "_silu_and_mul_kernel", act


def main() -> int:
    for name, module, kernel_name, call in cases():
        compile_case(name, module, kernel_name, call)
    return 0


if __name__ == "__main__":
    sys.exit(main())
