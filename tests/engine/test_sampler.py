"""Sampler: greedy, seeded reproducibility independent of batch mates, and the filtering masks."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from bulkrun.engine.core.params import SamplingParams
from bulkrun.engine.worker.sampler import Sampler as DeviceSampler
from bulkrun.engine.worker.sampler import draw_uniform

VOCAB = 50


class Sampler:
    """The sampler's draws read back as the step handle reads them: (tokens, {row: logprob}).
    `widen_on_host=False` is the GPU's choice (top-p rows sort their whole vocabulary)."""

    def __init__(self, seed=None, widen_on_host=True):
        self._sampler = DeviceSampler(seed, widen_on_host=widen_on_host)

    def __call__(self, logits, params, output_indices):
        drawn = self._sampler(logits, params, output_indices)
        values = [] if drawn.logprobs is None else drawn.logprobs.tolist()
        return drawn.tokens.tolist(), dict(zip(drawn.logprob_rows, values, strict=True))


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_take_the_argmax_and_report_the_model_logprob():
    logits = _logits(4)
    params = [
        SamplingParams(),
        SamplingParams(logprobs=True),
        SamplingParams(),
        SamplingParams(logprobs=True),
    ]
    tokens, logprobs = Sampler()(logits, params, [0, 3, 1, 0])
    assert tokens == logits.argmax(-1).tolist()
    assert set(logprobs) == {1, 3}
    for row in (1, 3):
        assert logprobs[row] == pytest.approx(float(logits[row].log_softmax(-1).max()))


def test_seeded_draw_depends_only_on_seed_and_output_index():
    logits = _logits(6, seed=1)
    mine = SamplingParams(temperature=1.0, seed=42)
    alone, _ = Sampler(seed=1)(logits[2:3], [mine], [7])
    mates = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(), SamplingParams(temperature=2.0)]
    batch = torch.cat([logits[:2], logits[2:3], logits[3:4]])
    crowded, _ = Sampler(seed=99)(batch, [mates[0], mates[1], mine, mates[2]], [0, 0, 7, 3])
    assert crowded[2] == alone[0]
    # the same (seed, index) again, e.g. after a preemption recomputed the request, draws the same
    again, _ = Sampler(seed=5)(logits[2:3], [mine], [7])
    assert again == alone
    assert draw_uniform(42, 7) == draw_uniform(42, 7) != draw_uniform(42, 8)


def test_seeded_draws_follow_the_distribution():
    logits = torch.tensor([[0.0, math.log(3.0), float("-inf"), math.log(6.0)]])
    params = SamplingParams(temperature=1.0, seed=3)
    counts = collections.Counter(Sampler()(logits, [params], [j])[0][0] for j in range(3000))
    assert counts[2] == 0
    assert counts[0] / 3000 == pytest.approx(0.1, abs=0.03)
    assert counts[1] / 3000 == pytest.approx(0.3, abs=0.04)
    assert counts[3] / 3000 == pytest.approx(0.6, abs=0.04)


def _support(logits: torch.Tensor, params: SamplingParams, draws: int = 400, widen=True) -> set[int]:
    sampler = Sampler(seed=0, widen_on_host=widen)
    return {sampler(logits, [params], [j])[0][0] for j in range(draws)}


def test_top_k_keeps_only_the_k_best():
    logits = _logits(1, seed=2)
    best3 = set(logits[0].topk(3).indices.tolist())
    assert _support(logits, SamplingParams(temperature=5.0, top_k=3, seed=1)) == best3


@pytest.mark.parametrize("widen", [True, False])
def test_top_p_keeps_the_smallest_set_reaching_p(widen):
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    logits = torch.cat([probs.log(), torch.full((1, VOCAB - 4), -30.0)], dim=1)
    assert _support(logits, SamplingParams(temperature=1.0, top_p=0.7, seed=1), widen=widen) == {0, 1}
    assert _support(logits, SamplingParams(temperature=1.0, top_p=0.8, seed=1), widen=widen) == {0, 1, 2}
    assert _support(logits, SamplingParams(temperature=1.0, top_p=0.5, seed=1), widen=widen) == {0}


def test_top_p_draws_the_same_token_with_or_without_widening_on_the_host():
    # nearly flat, no ties: the host path widens past 1,024 candidates; the device path sorts at once
    logits = torch.randn(1, 3000, generator=torch.Generator().manual_seed(8)) * 0.3
    params = [SamplingParams(temperature=1.0, top_p=p, seed=s) for p in (0.3, 0.9, 0.99) for s in (1, 2, 3)]
    rows = torch.cat([logits] * len(params))
    indices = list(range(len(params)))
    host, _ = Sampler(widen_on_host=True)(rows, params, indices)
    device, _ = Sampler(widen_on_host=False)(rows, params, indices)
    assert host == device


def test_top_p_falls_back_to_a_full_sort_when_candidates_are_too_few():
    logits = torch.zeros(1, 3000)  # uniform: 0.9 of the mass needs 2700 tokens, beyond the first guess
    support = _support(logits, SamplingParams(temperature=1.0, top_p=0.9, seed=1), draws=60)
    assert max(support) >= 1024  # tokens outside the first candidate set are reachable


def test_top_k_with_top_p_renormalises_over_the_top_k():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    logits = probs.log()
    # top-k 2 leaves {0: 4/7, 1: 3/7}; top-p 0.5 of that is token 0 alone
    assert _support(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5, seed=1)) == {0}


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    probs = torch.tensor([[0.5, 0.3, 0.12, 0.08]])
    support = _support(probs.log(), SamplingParams(temperature=1.0, min_p=0.2, seed=1))
    assert support == {0, 1, 2}  # 0.08 < 0.2 * 0.5


def test_sampled_logprob_is_the_raw_model_distribution():
    logits = _logits(1, seed=4)
    params = SamplingParams(temperature=0.5, top_k=4, logprobs=True, seed=9)
    tokens, logprobs = Sampler()(logits, [params], [0])
    assert logprobs[0] == pytest.approx(float(logits[0].log_softmax(-1)[tokens[0]]))


def test_a_row_needing_more_top_p_candidates_does_not_change_its_batch_mates():
    flat = torch.zeros(1, 3000)  # needs ~2700 candidates for top_p 0.9
    peaked = torch.randn(1, 3000, generator=torch.Generator().manual_seed(6)) * 8
    p_flat, p_peaked = (
        SamplingParams(temperature=1.0, top_p=0.9, seed=1),
        SamplingParams(temperature=1.0, top_p=0.9, seed=2),
    )
    together, _ = Sampler()(torch.cat([flat, peaked]), [p_flat, p_peaked], [4, 4])
    assert together == Sampler()(flat, [p_flat], [4])[0] + Sampler()(peaked, [p_peaked], [4])[0]
