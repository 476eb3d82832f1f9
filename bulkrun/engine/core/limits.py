"""The step budget (running sequences, tokens per step) and KV-cache size of a run. Plain Python.

When the user gives no budget it is chosen for the device, as vLLM's offline defaults do: a large
GPU wants big steps to fill its SMs (>= 70 GiB: 16,384 tokens and 1,024 sequences; a smaller one
8,192 and 256); the CPU takes smaller steps (2,048 tokens, 256 sequences). The runner fills in the KV
cache it sized, after profiling a step at the full budget, so a report can print the choices.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bulkrun.engine.core.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, EngineConfig

LARGE_GPU_BYTES = 70 << 30


@dataclass
class EngineLimits:
    device: str  # "cpu", "cuda" ...
    max_num_seqs: int
    max_num_batched_tokens: int
    chosen_for_device: bool  # False: the budget came from the config
    num_kv_blocks: int = 0
    kv_cache_bytes: int = 0
    profile_peak_bytes: int = 0  # activations of the largest step (CUDA), measured
    profile_step: str = ""  # that step in words (CUDA): its sequences, scored rows, sampler rows

    def as_dict(self) -> dict:
        return asdict(self)


def choose_limits(config: EngineConfig, device_type: str, device_memory_bytes: int = 0) -> EngineLimits:
    if device_type == "cuda":
        large = device_memory_bytes >= LARGE_GPU_BYTES
        seqs, tokens = (1024, 16384) if large else (256, 8192)
    else:
        seqs, tokens = DEFAULT_MAX_NUM_SEQS, DEFAULT_MAX_NUM_BATCHED_TOKENS
    return EngineLimits(
        device=device_type,
        max_num_seqs=config.max_num_seqs or seqs,
        max_num_batched_tokens=config.max_num_batched_tokens or tokens,
        chosen_for_device=config.max_num_seqs is None or config.max_num_batched_tokens is None,
    )
