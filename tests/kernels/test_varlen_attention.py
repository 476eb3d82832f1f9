"""The Triton varlen bidirectional attention and the CPU path against the plain reference."""

from __future__ import annotations

import pytest
import torch

from bulkrun_kernels.varlen_attention import varlen_attention
from bulkrun_kernels.varlen_attention_ref import (
    _similar_runs,
    varlen_attention_reference,
    varlen_attention_sdpa,
)


def packed(lengths, heads, head_dim, dtype, device, seed=0, strided=False):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    if strided:  # q, k, v as views of one fused projection, as the encoder makes them
        qkv = torch.randn(total, 3 * heads * head_dim, generator=g).to(dtype)
        q, k, v = (t.view(total, heads, head_dim) for t in qkv.split(heads * head_dim, dim=-1))
    else:
        q, k, v = (torch.randn(total, heads, head_dim, generator=g).to(dtype) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return [t.to(device) for t in (q, k, v, cu)]


# single tokens, lengths around the 16/32/64 block edges, one long sequence over many key blocks
LENGTHS = [[1], [5, 1, 17], [33, 64, 65, 2], [130, 7], [16, 16, 16, 16, 31]]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize(("head_dim", "dtype", "tol"), [(32, torch.float32, 2e-5), (24, torch.float32, 2e-5),
                                                        (64, torch.bfloat16, 2e-2)])  # fmt: skip
def test_triton_matches_reference(lengths, head_dim, dtype, tol, device):
    q, k, v, cu = packed(lengths, 3, head_dim, dtype, device, seed=len(lengths), strided=head_dim == 32)
    got = varlen_attention(q, k, v, cu, head_dim**-0.5)
    want = varlen_attention_reference(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), head_dim**-0.5)
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)


# the CPU path pads runs of similar lengths: runs longer than its cap, runs broken by an outlier
CPU_LENGTHS = [*LENGTHS, [9, 9, 8, 8, 8] * 15, [30, 29, 28, 3, 27, 26, 1, 1]]


@pytest.mark.parametrize("lengths", CPU_LENGTHS)
def test_cpu_path_matches_reference(lengths):
    q, k, v, cu = packed(lengths, 2, 16, torch.float32, "cpu", seed=3, strided=True)
    got = varlen_attention_sdpa(q, k, v, cu, 0.25)
    want = varlen_attention_reference(q, k, v, cu, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sequences_do_not_see_each_other():
    q, k, v, cu = packed([4, 6], 1, 8, torch.float32, "cpu", seed=5)
    alone = varlen_attention_reference(q[4:], k[4:], v[4:], torch.tensor([0, 6], dtype=torch.int32), 0.3)
    together = varlen_attention_reference(q, k, v, cu, 0.3)
    torch.testing.assert_close(together[4:], alone)


def test_bad_arguments_are_refused(device):
    q, k, v, cu = packed([3], 2, 16, torch.float32, device)
    with pytest.raises(ValueError, match="cu_seqlens"):
        varlen_attention(q, k, v, cu.long(), 1.0)
    with pytest.raises(ValueError, match="share shape"):
        varlen_attention(q, k[:, :1], v, cu, 1.0)


def test_similar_runs_split_at_outliers_and_the_cap():
    bounds = [0, *torch.tensor([30, 29, 28, 3, 27, 26]).cumsum(0).tolist()]
    assert _similar_runs(bounds) == [(0, 3), (3, 4), (4, 6)]
    many = [0, *torch.full((70,), 5).cumsum(0).tolist()]
    assert _similar_runs(many) == [(0, 64), (64, 70)]
