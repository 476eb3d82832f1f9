"""From final hidden states to embeddings: pool each sequence's rows, cut to --dimensions, normalize.

Encoders pool over a packed [T, hidden] batch (every sequence whole in the step); a decoder embedder's
last-token vector is the final hidden row the step already produces for its last prompt token, so it
comes here as one row per request. Pooling is fp32 whatever the model computed in.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from bulkrun.engine.core.params import PoolingParams
from bulkrun.engine.core.runner_output import RunnerOutput
from bulkrun.engine.core.scoring import ScoreRows


def pool_packed(hidden: torch.Tensor, lengths: list[int], methods: list[str]) -> torch.Tensor:
    """[B, hidden] fp32: sequence b's rows (lengths[b] of them, packed in order) pooled by methods[b]."""
    hidden = hidden.float()
    device = hidden.device
    lens = torch.tensor(lengths, device=device)
    ends = lens.cumsum(0)
    starts = ends - lens
    pooled = torch.empty(len(lengths), hidden.shape[1], dtype=torch.float32, device=device)
    for method in set(methods):
        rows = torch.tensor([i for i, m in enumerate(methods) if m == method], device=device)
        if method == "cls":
            pooled[rows] = hidden[starts[rows]]
        elif method == "last":
            pooled[rows] = hidden[ends[rows] - 1]
        elif method == "mean":
            seq_of_row = torch.repeat_interleave(torch.arange(len(lengths), device=device), lens)
            sums = torch.zeros_like(pooled).index_add_(0, seq_of_row, hidden)
            pooled[rows] = sums[rows] / lens[rows, None]
        else:
            raise ValueError(f"unknown pooling method {method!r}")
    return pooled


def pool_last_rows(rows: ScoreRows, hidden: torch.Tensor, handle) -> None:
    """The decoder runner's fixed point: the step's final hidden rows end with one row per POOL
    request whose last prompt token was computed (ScoreRows order). Their vectors stay on the device
    until the step handle's result() fills result.pooled (no host wait inside launch()).
    Only last-token pooling exists here: a decoder's earlier rows are gone once their chunk ran."""
    requests = rows.pool_requests
    last = hidden[hidden.shape[0] - len(requests) :].float()
    for start, vectors in finish_on_device(last, [r.pooling for r in requests]):
        ids = [r.request_id for r in requests[start : start + vectors.shape[0]]]
        handle.read_back(vectors, partial(_fill_pooled, ids))


def _fill_pooled(ids: list[str], vectors: np.ndarray, result: RunnerOutput) -> None:
    result.pooled.update(zip(ids, vectors, strict=True))


def finish(pooled: torch.Tensor, params: list[PoolingParams]) -> list[np.ndarray]:
    """Each row cut to its request's dimensions (Matryoshka: first N, then normalized) and
    normalized where asked; float32 numpy vectors on the host."""
    return [row for _, rows in finish_on_device(pooled, params) for row in rows.cpu().numpy()]


def finish_on_device(pooled: torch.Tensor, params: list[PoolingParams]) -> list[tuple[int, torch.Tensor]]:
    """(first row, finished rows) groups, still on the device: the whole batch as one vector
    operation when every row has the same settings, else one row at a time (slices, no index)."""
    first = params[0]
    if all(p == first for p in params):
        return [(0, _finish_rows(pooled, first))]
    return [(i, _finish_rows(pooled[i : i + 1], p)) for i, p in enumerate(params)]


def _finish_rows(rows: torch.Tensor, p: PoolingParams) -> torch.Tensor:
    if p.dimensions is not None:
        rows = rows[:, : p.dimensions]
    if p.normalize:
        rows = F.normalize(rows, p=2.0, dim=-1)
    return rows
