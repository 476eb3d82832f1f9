"""The fused MoE's token bookkeeping never makes a GPU host wait: a MoE layer's forward runs inside
captured CUDA graphs, and one sync there leaves every decode step eager (gpu_check stage 09)."""

from __future__ import annotations

import torch
from sync_recorder import SyncRecorder

from bulkrun_kernels.moe_routing import combine, sort_by_expert


def _routed(tokens: int = 13, experts: int = 8, k: int = 2):
    generator = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(experts, generator=generator)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=generator)
    return ids, weights


def test_sorting_and_combining_by_expert_read_nothing_back():
    ids, weights = _routed()
    recorder = SyncRecorder()
    with recorder.active():
        order, counts, offsets = sort_by_expert(ids, 8)
        outputs = torch.randn(ids.numel(), 16)
        combine(outputs, order, weights, torch.float32)
    assert recorder.syncs == []
    assert counts.tolist() == torch.bincount(ids.reshape(-1), minlength=8).tolist()
    assert offsets.tolist() == [0, *torch.cumsum(counts, 0).tolist()]


def test_the_recorder_catches_a_count_sized_by_the_data():
    ids, _ = _routed()
    recorder = SyncRecorder()
    with recorder.active():
        torch.bincount(ids.reshape(-1), minlength=8)
    assert len(recorder.syncs) == 1 and "bincount" in recorder.syncs[0]
