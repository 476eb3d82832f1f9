"""Engine settings shared by the scheduler, the block pool and the model runner. Plain Python."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    block_size: int = 16
    kv_cache_bytes: int | None = None  # None -> sensible default from free memory
    max_num_seqs: int = 256  # max running sequences
    max_num_batched_tokens: int = 1024  # per-step token budget
    enable_prefix_caching: bool = True
    dtype: str | None = None  # None -> float32 on CPU, bfloat16 on CUDA
    device: str | None = None  # None -> cuda if available else cpu
    kernels: str = "auto"  # "auto" | "triton" | "cpu" | "reference"
    max_waiting: int = 1024  # backpressure threshold for has_capacity()
    max_model_len: int | None = None  # None -> the model's context length; lower caps it

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if self.kernels not in ("auto", "triton", "cpu", "reference"):
            raise ValueError(f"kernels must be auto, triton, cpu or reference, got {self.kernels!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
