"""A model ready to run: its tokenizer, kernels, dtype, weights, greedy head and oneDNN packing.

Everything a ModelRunner needs that depends only on the model directory and the config's device,
dtype and kernels, so one load can serve several runners: load() keeps the last model it loaded, and
the next job of this process with the same settings (a notebook's next `bulkrun.run`, a sweep's next
run) takes it instead of loading, converting and packing it again. One model at a time: loading
another lets the previous one go.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.tokenizer import load_tokenizer
from bulkrun.engine.worker.cpu_env import keep_freed_memory
from bulkrun.engine.worker.device import resolve_device
from bulkrun.model.decoder import DecoderLM
from bulkrun.model.greedy_head import build_greedy_head
from bulkrun.model.layers import fuse_gated_mlps
from bulkrun.model.linear import pack_linears_for_cpu, set_batch_invariant
from bulkrun.model.loader import load_model
from bulkrun_kernels import get_ops
from bulkrun_kernels.cpu_dtype import default_cpu_dtype

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_LAST: dict[tuple, LoadedModel] = {}  # the last load, under its _key


@dataclass(frozen=True)
class LoadedModel:
    tokenizer: Any
    ops: Any  # bulkrun_kernels.KernelOps
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    model: Any  # bulkrun.model.decoder.DecoderLM (the family's subclass)
    greedy_head: Any  # exact argmax from a bf16 screen, None where that is not faster
    onednn: bool  # the linears are packed for oneDNN
    batch_invariant: bool  # every kernel's per-row reduction order is fixed (config.batch_invariant)


def resolve_device_dtype(config: EngineConfig, backend: str) -> tuple[torch.device, torch.dtype, str]:
    """The run's device, its dtype and why that dtype: the one asked for; bfloat16 on CUDA; on the
    CPU bfloat16 where it multiplies bf16 natively and the native kernels run (faster linears, half
    the KV cache; speed and quality against fp32: bench/precision_bench.py), else float32."""
    device = resolve_device(config.device)
    if config.dtype is not None:
        if config.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {config.dtype!r}")
        return device, _DTYPES[config.dtype], "asked for"
    if device.type == "cuda":
        return device, torch.bfloat16, "the CUDA default"
    if backend != "cpu":
        return device, torch.float32, f"the CPU default with the {backend} kernels (bf16 would be emulated)"
    dtype = default_cpu_dtype()
    if dtype == torch.bfloat16:
        return device, dtype, "the CPU default: native bf16 dot products and the native kernels"
    return device, dtype, "the CPU default: no native bf16 dot products here"


def is_loaded(model_dir: str, config: EngineConfig) -> bool:
    """Whether load() would take the last model loaded instead of loading one."""
    return _key(model_dir, config) in _LAST


def planned_device_dtype(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """The device and dtype a load with these settings runs in, known before any weights load."""
    device = resolve_device(config.device)
    device, dtype, _ = resolve_device_dtype(
        config, get_ops(config.kernels, device, config.batch_invariant).backend
    )
    return device, dtype


def load(model_dir: str, config: EngineConfig) -> LoadedModel:
    """The model for these settings: the last one loaded where its settings and files are these,
    else a fresh load (which replaces it)."""
    key = _key(model_dir, config)
    if key not in _LAST:
        _LAST.clear()  # before loading: the previous model's memory can go first
        _LAST[key] = _load(model_dir, config)
    return _LAST[key]


def forget() -> None:
    """Drop the kept model: the next load() reads, converts and packs the weights again (for a
    caller about to change a model it loaded, which must not change another caller's)."""
    _LAST.clear()


def _key(model_dir: str, config: EngineConfig) -> tuple:
    """The settings a load depends on, and each file's name, size and mtime: weights rewritten in
    place are loaded again."""
    files = tuple(
        (e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(model_dir) if e.is_file()
    )
    settings = (config.device, config.dtype, config.kernels, config.batch_invariant)
    return (str(model_dir), *settings, tuple(sorted(files)))


def _load(model_dir: str, config: EngineConfig) -> LoadedModel:
    tokenizer = load_tokenizer(model_dir)  # first: what it still imports overlaps the model load
    device = resolve_device(config.device)
    if device.type == "cpu":
        keep_freed_memory()
    ops = get_ops(config.kernels, device, config.batch_invariant)
    device, dtype, dtype_reason = resolve_device_dtype(config, ops.backend)
    model = load_model(model_dir, ops, dtype, device)
    greedy_head = build_greedy_head(model, device, dtype, ops.backend)
    set_batch_invariant(model, config.batch_invariant)
    onednn = device.type == "cpu" and pack_linears_for_cpu(model)
    if onednn:  # after packing: these reorder the tiles of gate_up and q/k/v
        fuse_gated_mlps(model)
        if isinstance(model, DecoderLM):
            model.fuse_qkv_rotary()
    return LoadedModel(
        tokenizer, ops, device, dtype, dtype_reason, model, greedy_head, onednn, config.batch_invariant
    )
