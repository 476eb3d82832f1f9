"""Which float dtype a CPU run computes in when the user names none.

bfloat16 where the CPU multiplies bf16 natively (avx512_bf16 or AMX) and oneDNN uses it: the
prepacked bf16 linears then run 4-10x faster than fp32 ones and the KV cache takes half the memory.
Elsewhere bf16 is emulated, slower than fp32, so the run stays in float32 and says so once.
A dtype the user asks for is always honoured (float32 gives exact parity with transformers' fp32).
"""

from __future__ import annotations

import logging

import torch

from .cpu_build import cpu_flags

log = logging.getLogger("bulkrun.kernels")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
_said: set[str] = set()


def native_bf16() -> bool:
    """oneDNN runs bf16 here on native dot-product instructions (not emulated)."""
    if not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return not cpu_flags().isdisjoint(NATIVE_BF16_FLAGS)


def default_cpu_dtype() -> torch.dtype:
    """bfloat16 where native_bf16(), else float32 (logging the fallback once per process)."""
    if native_bf16():
        return torch.bfloat16
    if "fallback" not in _said:
        _said.add("fallback")
        log.info(
            "this CPU has no native bf16 dot products (%s): running in float32", "/".join(NATIVE_BF16_FLAGS)
        )
    return torch.float32
