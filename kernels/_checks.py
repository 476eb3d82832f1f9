"""Argument checks shared by the Triton wrappers: shape/dtype/device only, never a host sync.

Only metadata is inspected (no `.item()`, no copies), so the wrappers stay usable inside CUDA graphs.
"""

from __future__ import annotations

import torch


def check_ndim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise ValueError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{n}={d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    return first


def check_runnable(kernel, device: torch.device) -> None:
    """A compiled kernel needs a GPU; the interpreter (TRITON_INTERPRET=1) runs on CPU tensors."""
    interpreted = type(kernel).__name__ == "InterpretedFunction"
    if device.type == "cpu" and not interpreted:
        raise ValueError(
            "Triton kernels need GPU tensors; on the CPU use the reference backend "
            "(or set TRITON_INTERPRET=1 before bulkrun_kernels' Triton modules are imported, for tests)"
        )


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {t.stride()}")


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
