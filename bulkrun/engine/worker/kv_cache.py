"""The paged KV cache: one preallocated tensor of fixed-size blocks, shared by all layers.

Layout [num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim]: each layer's K (and V)
is one contiguous [num_blocks, block_size, Hkv, D] tensor, and one block's keys are one contiguous run
of memory, which is what the CPU attention gathers.
"""

from __future__ import annotations

import mmap

import numpy as np
import psutil
import torch

from bulkrun.model.config import ModelConfig

CPU_DEFAULT_FRACTION = 0.25  # of available memory
CPU_DEFAULT_CAP = 4 << 30


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty(0, dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * element


def default_cpu_kv_bytes() -> int:
    return int(min(CPU_DEFAULT_FRACTION * psutil.virtual_memory().available, CPU_DEFAULT_CAP))


class KVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype, device):
        if num_blocks < 1:
            raise ValueError(
                f"the KV cache budget holds no block of {block_size} tokens "
                f"({bytes_per_block(cfg, block_size, dtype)} bytes each); raise kv_cache_bytes"
            )
        shape = (cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.data = _zeros(shape, dtype, torch.device(device))
        # Never-written slots are read (and masked) when a group is padded: they must be finite.
        self.layers = [(self.data[i, 0], self.data[i, 1]) for i in range(cfg.num_layers)]

    @classmethod
    def from_budget(cls, cfg: ModelConfig, budget_bytes: int, block_size: int, dtype, device) -> KVCache:
        return cls(cfg, budget_bytes // bytes_per_block(cfg, block_size, dtype), block_size, dtype, device)


def _zeros(shape, dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    # An anonymous mapping: the kernel hands out zero pages lazily, so a large cache costs nothing
    # until used (torch.zeros writes every byte up front: seconds per GiB here). Plain 4 KiB pages:
    # numpy's calloc asks for huge pages, whose first touch stalled writes up to 9 ms on compaction.
    nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    buffer = mmap.mmap(-1, nbytes)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)
