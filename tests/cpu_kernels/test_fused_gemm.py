"""The AMX GEMMs with an op fused into their epilogue, each giving the bits of the GEMM then the op,
whatever rows share the call: amx_gemm_gated (gate_up, then silu_and_mul / gelu_tanh_and_mul) and
amx_gemm_qkv (q/k/v, then rotary and write_kv)."""

from __future__ import annotations

import pytest
import torch

from bulkrun_kernels import cpu_build, cpu_gemm

G = torch.Generator().manual_seed(0)
pytestmark = pytest.mark.skipif(
    not (
        cpu_build.compiler_available()
        and cpu_build.load()
        and cpu_gemm.gated_gemm_available()
        and cpu_gemm.qkv_gemm_available()
    ),
    reason="no AMX here",
)
OPS = {"silu": "silu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}


def _case_n(n: int, k: int, bias: bool):
    w = (torch.randn(n, k, generator=G) * 0.2).bfloat16()
    b = torch.randn(n, generator=G) if bias else None
    wp = cpu_gemm.pack_amx(w)
    return wp, cpu_gemm.pad_bias(b, wp)


def _case(inter: int, k: int, bias: bool):
    return _case_n(2 * inter, k, bias)


def _unfused(x, wp, bp, inter, activation):
    h = cpu_gemm.bf16_gemm(x, wp, bp, 2 * inter)
    out = torch.empty(x.shape[0], inter, dtype=torch.bfloat16)
    getattr(torch.ops.bulkrun_cpu, OPS[activation])(h, out)
    return out


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(("inter", "k"), [(1536, 576), (64, 96), (16, 32)])
@pytest.mark.parametrize("bias", [False, True])
# a decode-sized call and a prompt step's (amx_gemm runs 768 rows and more in another loop order)
@pytest.mark.parametrize("rows", [1, 37, 1000])
def test_the_bits_of_the_product_then_the_activation(activation, inter, k, bias, rows):
    wp, bp = _case(inter, k, bias)
    x = torch.randn(rows, k, generator=G).bfloat16()
    want = _unfused(x, wp, bp, inter, activation)
    got = cpu_gemm.gated_gemm(
        x, cpu_gemm.interleave_gate_up(wp), cpu_gemm.interleave_gate_up(bp), inter, activation
    )
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_rows_do_not_depend_on_the_batch():
    wp, bp = _case(128, 64, True)
    wi, bi = cpu_gemm.interleave_gate_up(wp), cpu_gemm.interleave_gate_up(bp)
    x = torch.randn(900, 64, generator=G).bfloat16()
    full = cpu_gemm.gated_gemm(x, wi, bi, 128, "silu")
    for rows in (1, 5, 16, 17, 33, 767, 768, 899):
        assert torch.equal(cpu_gemm.gated_gemm(x[:rows], wi, bi, 128, "silu"), full[:rows]), rows
    perm = torch.randperm(900, generator=G)
    assert torch.equal(cpu_gemm.gated_gemm(x[perm], wi, bi, 128, "silu"), full[perm])


def test_interleaving_is_a_reorder_of_whole_blocks():
    wp, bp = _case(48, 32, True)  # 3 gate blocks, 3 up blocks
    wi, bi = cpu_gemm.interleave_gate_up(wp), cpu_gemm.interleave_gate_up(bp)
    assert [torch.equal(wi[i], wp[j]) for i, j in enumerate((0, 3, 1, 4, 2, 5))] == [True] * 6
    assert torch.equal(bi.view(6, 16)[1], bp.view(6, 16)[3])
    with pytest.raises(ValueError, match="whole column blocks"):
        cpu_gemm.interleave_gate_up(cpu_gemm.pack_amx(torch.randn(48, 32)))


def test_rejects_bad_input():
    wp, _ = _case(64, 64, False)
    wi = cpu_gemm.interleave_gate_up(wp)
    x = torch.randn(3, 64).bfloat16()
    with pytest.raises(RuntimeError, match="silu or gelu_tanh"):
        cpu_gemm.gated_gemm(x, wi, None, 64, "relu")
    with pytest.raises(RuntimeError, match="twice as many"):
        cpu_gemm.gated_gemm(x, wi, None, 32, "silu")
    with pytest.raises(RuntimeError, match="columns"):
        cpu_gemm.gated_gemm(torch.randn(3, 96).bfloat16(), wi, None, 64, "silu")


def _rotary_table(positions: int, head_dim: int) -> torch.Tensor:
    freqs = torch.arange(positions).float()[:, None] * (
        10000.0 ** (-torch.arange(0, head_dim, 2).float() / head_dim)
    )
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def _qkv_unfused(x, wp, bp, heads, positions, table, slots, k_cache, v_cache):
    h, hk, d = heads
    qkv = cpu_gemm.bf16_gemm(x, wp, bp, (h + 2 * hk) * d)
    q, k, v = qkv.split((h * d, hk * d, hk * d), dim=-1)
    q, k, v = q.view(-1, h, d), k.view(-1, hk, d), v.view(-1, hk, d)
    torch.ops.bulkrun_cpu.rotary(q, k, positions, table, q, k)
    torch.ops.bulkrun_cpu.write_kv(k, v, k_cache, v_cache, slots)
    return q.contiguous()


# (heads, kv heads, head_dim): the default model's, wider heads, a 32-dim head
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 2, 128), (2, 1, 32)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 37, 1000])
def test_qkv_with_rotary_and_the_kv_write_gives_their_bits(heads, bias, rows):
    h, hk, d = heads
    wp, bp = _case_n((h + 2 * hk) * d, 96, bias)
    x = torch.randn(rows, 96, generator=G).bfloat16()
    table = _rotary_table(2048, d)
    positions = torch.randint(0, 2048, (rows,), generator=G)
    slots = torch.randperm(4 * rows, generator=G)[:rows]
    slots[1::7] = -1  # padding rows: no K/V written
    caches = [torch.zeros(rows, 4, hk, d, dtype=torch.bfloat16) for _ in range(4)]
    want = _qkv_unfused(x, wp, bp, heads, positions, table, slots, caches[0], caches[1])
    got = cpu_gemm.qkv_gemm(x, cpu_gemm.rotary_qkv_blocks(wp, *heads), cpu_gemm.rotary_qkv_blocks(bp, *heads), heads, positions, table, slots,
                   caches[2], caches[3])  # fmt: skip
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(caches[2].view(torch.int16), caches[0].view(torch.int16))
    assert torch.equal(caches[3].view(torch.int16), caches[1].view(torch.int16))
    assert caches[2].abs().sum() > 0


def test_qkv_rows_do_not_depend_on_the_batch():
    heads = (9, 3, 64)
    wp, bp = _case_n(15 * 64, 64, True)
    wr, br = cpu_gemm.rotary_qkv_blocks(wp, *heads), cpu_gemm.rotary_qkv_blocks(bp, *heads)
    x = torch.randn(900, 64, generator=G).bfloat16()
    table = _rotary_table(1024, 64)
    positions = torch.randint(0, 1024, (900,), generator=G)
    cache = lambda: torch.zeros(900, 3, 64, dtype=torch.bfloat16)  # noqa: E731
    full_k, full_v = cache(), cache()
    full = cpu_gemm.qkv_gemm(x, wr, br, heads, positions, table, torch.arange(900), full_k, full_v)
    for rows in (1, 17, 768, 899):
        k, v = cache(), cache()
        q = cpu_gemm.qkv_gemm(x[:rows], wr, br, heads, positions[:rows], table, torch.arange(rows), k, v)
        assert torch.equal(q, full[:rows]) and torch.equal(k[:rows], full_k[:rows]), rows
        assert torch.equal(v[:rows], full_v[:rows]), rows


def test_qkv_rejects_bad_input():
    heads = (2, 1, 64)
    wp, _ = _case_n(4 * 64, 64, False)
    wr = cpu_gemm.rotary_qkv_blocks(wp, *heads)
    x = torch.randn(3, 64).bfloat16()
    k, v = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
    pos, slots = torch.arange(3), torch.arange(3)
    with pytest.raises(RuntimeError, match="whole head"):
        cpu_gemm.qkv_gemm(x, wr, None, heads, pos, _rotary_table(16, 32), slots, k, v)  # partial rotary
    with pytest.raises(RuntimeError, match="slot out of range"):
        cpu_gemm.qkv_gemm(x, wr, None, heads, pos, _rotary_table(16, 64), torch.tensor([0, 1, 8]), k, v)
    with pytest.raises(RuntimeError, match="position out of"):
        cpu_gemm.qkv_gemm(x, wr, None, heads, torch.tensor([0, 1, 16]), _rotary_table(16, 64), slots, k, v)
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_gemm.rotary_qkv_blocks(cpu_gemm.pack_amx(torch.randn(4 * 48, 64)), 2, 1, 48)
