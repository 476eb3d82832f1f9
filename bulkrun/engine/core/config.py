"""Engine settings shared by the scheduler, the block pool and the model runner. Plain Python."""

from __future__ import annotations

from dataclasses import dataclass

from bulkrun_kernels import check_backend_name

# Budgets when neither the user nor the device chooses (the CPU). 2,048 tokens a step: on an AMX CPU
# ~2% faster than 1,024 on both of bench/vllm_peer_bench.py's workloads (fewer prompt steps, so fewer
# passes over the weights), no change on a Zen 5 (docs/benchmarks.md); the linears keep their
# panels in L2 at any row count.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass
class EngineConfig:
    block_size: int = 16
    kv_cache_bytes: int | None = None  # None -> sensible default from free memory
    # None: chosen for the device (bulkrun.engine.core.limits.choose_limits)
    max_num_seqs: int | None = None  # max running sequences
    max_num_batched_tokens: int | None = None  # per-step token budget
    enable_prefix_caching: bool = True
    dtype: str | None = None  # None -> bfloat16 on CUDA; on the CPU bfloat16 where native, else float32
    device: str | None = None  # None -> cuda if available else cpu
    kernels: str = "auto"  # a name in bulkrun_kernels.BACKENDS
    max_waiting: int = 1024  # backpressure threshold for has_capacity()
    max_model_len: int | None = None  # None -> the model's context length; lower caps it
    # schedule step N+1 while the device runs step N; None: on where the device runs apart from
    # the host (CUDA), off on the CPU
    async_scheduling: bool | None = None
    cuda_graphs: bool = True  # replay captured decode-only steps (CUDA only)
    # a request's bits do not depend on its batch mates, chunking or cache hits (docs/batch-invariance.md)
    batch_invariant: bool = True
    grammar_time_limit_s: float = 10.0  # a constraint compiling longer is refused (grammar.GrammarCache)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        check_backend_name(self.kernels)
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
