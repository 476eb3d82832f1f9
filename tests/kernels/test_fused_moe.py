"""Fused mixture of experts: the Triton grouped GEMM and both fused_moe paths (Triton, and the
reference the CPU runs) against a naive loop over tokens; empty experts, every token on one expert,
a step with no tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bulkrun_kernels import reference
from bulkrun_kernels.grouped_gemm import fused_moe, grouped_gemm
from bulkrun_kernels.moe_routing import sort_by_expert

E, H, INTER, K = 6, 48, 40, 2


def naive_moe(x, w_gate_up, w_down, ids, weights, activation="silu"):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = F.linear(x[t], w_gate_up[e]).chunk(2)
            act = F.gelu(gate, approximate="tanh") if activation == "gelu_tanh" else F.silu(gate)
            out[t] += weights[t, j] * F.linear(act * up, w_down[e])
    return out


def _case(num_tokens, routing, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, H, generator=g)
    w_gate_up = torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5
    w_down = torch.randn(E, H, INTER, generator=g) * INTER**-0.5
    if routing == "one_expert":  # every token's first choice is expert 3
        ids = torch.stack([torch.full((num_tokens,), 3), torch.randint(0, 3, (num_tokens,), generator=g)], 1)
    else:  # "random" over all experts, or "empty_experts": only 1, 3 and 4 (0, 2 and 5 get nothing)
        allowed = torch.tensor([1, 3, 4]) if routing == "empty_experts" else torch.arange(E)
        picks = [allowed[torch.randperm(len(allowed), generator=g)[:K]] for _ in range(num_tokens)]
        ids = torch.stack(picks) if picks else torch.zeros(0, K, dtype=torch.long)
    weights = torch.rand(num_tokens, K, generator=g)
    return [t.to(device) for t in (x, w_gate_up, w_down, ids, weights)]


ROUTINGS = ["random", "one_expert", "empty_experts"]


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("num_tokens", [1, 5, 70])
def test_triton_fused_moe_matches_a_loop_over_tokens(routing, num_tokens, device):
    args = _case(num_tokens, routing, seed=num_tokens, device=device)
    out, counts = fused_moe(*args)
    want = naive_moe(*[t.cpu() for t in args])
    torch.testing.assert_close(out.cpu(), want, atol=1e-5, rtol=1e-5)
    assert counts.cpu().tolist() == torch.bincount(args[3].cpu().reshape(-1), minlength=E).tolist()


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_reference_fused_moe_matches_a_loop_over_tokens(routing, activation):
    args = _case(33, routing, seed=3)
    out, counts = reference.fused_moe(*args, activation=activation)
    torch.testing.assert_close(out, naive_moe(*args, activation=activation), atol=1e-5, rtol=1e-5)
    if routing == "empty_experts":
        assert counts[[0, 2, 5]].tolist() == [0, 0, 0]
    if routing == "one_expert":
        assert counts[3] == 33


def test_grouped_gemm_rows_land_in_their_experts_runs(device):
    g = torch.Generator().manual_seed(1)
    ids = torch.tensor([[4], [4], [0], [4], [2], [4]] * 11)  # experts 1, 3, 5 empty; 4 heavy
    order, counts, offsets = sort_by_expert(ids, E)
    a = torch.randn(ids.numel(), H, generator=g)[order]
    w = torch.randn(E, 72, H, generator=g)
    got = grouped_gemm(a.to(device), w.to(device), offsets.to(device)).cpu()
    bounds = offsets.tolist()
    for e in range(E):
        part = slice(bounds[e], bounds[e + 1])
        torch.testing.assert_close(got[part], a[part] @ w[e].T, atol=1e-4, rtol=1e-5)


def test_a_step_without_tokens(device):
    out, counts = fused_moe(*_case(0, "random", device=device))
    assert out.shape == (0, H) and counts.sum() == 0


def test_expert_biases_and_the_clamped_swiglu(device):
    # gpt-oss's experts: biased projections, (clamp(up) + 1) * g * sigmoid(alpha g) with g = min(gate, limit)
    x, w_gate_up, w_down, ids, weights = _case(37, "empty_experts", seed=5)
    g = torch.Generator().manual_seed(6)
    b_gate_up, b_down = torch.randn(E, 2 * INTER, generator=g), torch.randn(E, H, generator=g)
    want = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(K):
            e = int(ids[t, j])
            gate, up = (F.linear(x[t], w_gate_up[e]) + b_gate_up[e]).chunk(2)
            gate, up = gate.clamp(max=0.5), up.clamp(-0.5, 0.5)
            want[t] += weights[t, j] * (
                F.linear((up + 1) * gate * torch.sigmoid(1.702 * gate), w_down[e]) + b_down[e]
            )
    extras = dict(b_gate_up=b_gate_up, b_down=b_down, swiglu=(1.702, 0.5))
    ref, _ = reference.fused_moe(x, w_gate_up, w_down, ids, weights, **extras)
    torch.testing.assert_close(ref, want, atol=1e-5, rtol=1e-5)
    moved = [t.to(device) for t in (x, w_gate_up, w_down, ids, weights)]
    got, _ = fused_moe(
        *moved, **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in extras.items()}
    )
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
