"""bulkrun's compute kernels: Triton for the GPU, native C++ for the CPU, plain PyTorch references.

    ops = get_ops("auto", device)          # or "triton" / "cpu" / "reference"
    ops.write_kv(k, v, k_cache, v_cache, slot_mapping)
    out = ops.paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                              window=0, sinks=None, softcap=0.0)   # see ATTENTION_SIGNATURE.md

Triton is imported lazily, only for the "triton" backend, so the reference path works on machines
without it. The "cpu" backend (kernels/cpu/*.cpp) is compiled once per machine on first use
(cpu_build.py); "auto" on the CPU falls back to the references where that cannot be done.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

BACKENDS = ("auto", "triton", "cpu", "reference")


@dataclass(frozen=True, slots=True)
class KernelOps:
    """The ops a model step calls, bound to one backend."""

    backend: str
    paged_attention: Callable
    write_kv: Callable
    rms_norm: Callable
    rotary: Callable
    silu_and_mul: Callable
    gelu_tanh_and_mul: Callable
    fused_moe: Callable
    # consecutive Llama-style layers in one native call (bulkrun/model/layer_stack.py); None: layer by layer
    decoder_layers: Callable | None = None


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def check_backend_name(backend: str) -> None:
    """The one check of a kernel backend's name (EngineConfig, hence the job spec and --kernels, call it)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def resolve_backend(backend: str, device=None) -> str:
    """'auto' -> 'triton' on CUDA when triton is installed; on the CPU 'cpu' when the native kernels
    build and load here, else 'reference'."""
    check_backend_name(backend)
    if backend != "auto":
        return backend
    if device is not None and str(device).startswith("cuda"):
        return "triton" if triton_available() else "reference"
    from . import cpu_build

    return "cpu" if cpu_build.load() else "reference"


def get_ops(backend: str = "auto", device=None, batch_invariant: bool = True) -> KernelOps:
    """The four ops (plus the gated activations) of one backend. `device` decides 'auto' and lets a forced
    'triton' on the CPU (or 'cpu' on CUDA) fail here, before any work, rather than at the first step."""
    backend = resolve_backend(backend, device)
    if backend == "reference":
        from . import reference

        ops = _ops_from("reference", reference)
        return (
            ops
            if batch_invariant
            else dataclasses.replace(ops, paged_attention=_not_invariant(ops.paged_attention))
        )
    if backend == "cpu":
        return _cpu_ops(device, batch_invariant)
    return _triton_ops(device, batch_invariant)


def _ops_from(backend: str, module) -> KernelOps:
    return KernelOps(
        backend=backend,
        paged_attention=module.paged_attention,
        write_kv=module.write_kv,
        rms_norm=module.rms_norm,
        rotary=module.rotary,
        silu_and_mul=module.silu_and_mul,
        gelu_tanh_and_mul=module.gelu_tanh_and_mul,
        fused_moe=module.fused_moe,
    )


def _cpu_ops(device, batch_invariant: bool) -> KernelOps:
    from . import cpu_build, cpu_ops

    if device is not None and not str(device).startswith("cpu"):
        raise ValueError(f"kernel backend 'cpu' runs on the CPU, got device {device}; use 'auto' there")
    if not cpu_build.load():
        raise ValueError(f"kernel backend 'cpu' could not be built here: {cpu_build.load_error()}")
    ops = dataclasses.replace(_ops_from("cpu", cpu_ops), decoder_layers=cpu_ops.decoder_layers)
    if batch_invariant:
        return ops
    return dataclasses.replace(
        ops,
        paged_attention=_not_invariant(cpu_ops.paged_attention),
        decoder_layers=_not_invariant(cpu_ops.decoder_layers),
    )


def _triton_ops(device, batch_invariant: bool) -> KernelOps:
    if not triton_available():
        raise ValueError("kernel backend 'triton' needs the triton package; install it or use 'reference'")
    from .activation import gelu_tanh_and_mul, silu_and_mul
    from .grouped_gemm import fused_moe
    from .kv_write import write_kv
    from .paged_attention import _paged_attention_kernel, paged_attention
    from .rmsnorm import rms_norm
    from .rotary import rotary

    interpreted = type(_paged_attention_kernel).__name__ == "InterpretedFunction"
    if device is not None and not str(device).startswith("cuda") and not interpreted:
        raise ValueError(
            f"kernel backend 'triton' needs a CUDA device, got {device}; use 'auto', 'cpu' or 'reference' there"
        )
    return KernelOps(
        backend="triton",
        paged_attention=paged_attention if batch_invariant else _not_invariant(paged_attention),
        write_kv=write_kv,
        rms_norm=rms_norm,
        rotary=rotary,
        silu_and_mul=silu_and_mul,
        gelu_tanh_and_mul=gelu_tanh_and_mul,
        fused_moe=fused_moe,
    )


def _not_invariant(attention: Callable) -> Callable:
    return functools.partial(attention, batch_invariant=False)


__all__ = ["BACKENDS", "KernelOps", "check_backend_name", "get_ops", "resolve_backend", "triton_available"]
