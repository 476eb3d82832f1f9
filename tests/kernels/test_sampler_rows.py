"""On CUDA a sampled row draws from the same cumulative distribution alone and among other rows.

torch scans a one-row tensor with CUB's device-wide scan and a many-row one row by row; over a
128k vocabulary the two orders round differently by about one token's probability, which moved
sampled tokens with the batch on an H200 (gpu_check stage 10). Runs where there is a GPU."""

from __future__ import annotations

import pytest
import torch

from bulkrun.engine.worker.sampler import row_cumsum

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("rows", [2, 3, 8])
def test_a_lone_row_scans_as_it_does_among_others(rows):
    generator = torch.Generator(device="cuda").manual_seed(0)
    probs = torch.softmax(torch.randn(8, 128256, device="cuda", generator=generator) * 0.5, dim=-1)
    assert torch.equal(row_cumsum(probs[:1]), row_cumsum(probs[:rows])[:1])


def test_row_cumsum_is_the_cumulative_sum():
    x = torch.rand(3, 1000, dtype=torch.float64)
    assert torch.equal(row_cumsum(x), x.cumsum(dim=-1))
    assert torch.equal(row_cumsum(x[:1]), x[:1].cumsum(dim=-1))
