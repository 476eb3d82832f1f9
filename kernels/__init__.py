"""bulkrun's compute kernels: Triton for the GPU, plain PyTorch references for the CPU.

    ops = get_ops("auto", device)          # or "triton" / "reference"
    ops.write_kv(k, v, k_cache, v_cache, slot_mapping)
    out = ops.paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)

Triton is imported lazily, only for the "triton" backend, so the reference path works on machines
without it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

BACKENDS = ("auto", "triton", "reference")


@dataclass(frozen=True, slots=True)
class KernelOps:
    """The ops a model step calls, bound to one backend."""

    backend: str
    paged_attention: Callable
    write_kv: Callable
    rms_norm: Callable
    rotary: Callable
    silu_and_mul: Callable


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend(backend: str, device=None) -> str:
    """'auto' -> 'triton' on CUDA when triton is installed, else 'reference'."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    on_cuda = device is not None and str(device).startswith("cuda")
    return "triton" if on_cuda and triton_available() else "reference"


def get_ops(backend: str = "auto", device=None) -> KernelOps:
    """The four ops (plus silu_and_mul) of one backend. `device` decides 'auto' and lets a forced
    'triton' on the CPU fail here, before any work, rather than at the first step."""
    backend = resolve_backend(backend, device)
    if backend == "reference":
        from . import reference

        return KernelOps(
            backend="reference",
            paged_attention=reference.paged_attention,
            write_kv=reference.write_kv,
            rms_norm=reference.rms_norm,
            rotary=reference.rotary,
            silu_and_mul=reference.silu_and_mul,
        )
    return _triton_ops(device)


def _triton_ops(device) -> KernelOps:
    if not triton_available():
        raise ValueError("kernel backend 'triton' needs the triton package; install it or use 'reference'")
    from .activation import silu_and_mul
    from .kv_write import write_kv
    from .paged_attention import _paged_attention_kernel, paged_attention
    from .rmsnorm import rms_norm
    from .rotary import rotary

    interpreted = type(_paged_attention_kernel).__name__ == "InterpretedFunction"
    if device is not None and not str(device).startswith("cuda") and not interpreted:
        raise ValueError(
            f"kernel backend 'triton' needs a CUDA device, got {device}; use 'reference' (or 'auto') there"
        )
    return KernelOps(
        backend="triton",
        paged_attention=paged_attention,
        write_kv=write_kv,
        rms_norm=rms_norm,
        rotary=rotary,
        silu_and_mul=silu_and_mul,
    )


__all__ = ["BACKENDS", "KernelOps", "get_ops", "resolve_backend", "triton_available"]
