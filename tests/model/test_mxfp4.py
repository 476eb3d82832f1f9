"""gpt-oss with MXFP4 experts (the published checkpoints' form): the test writes such a checkpoint of a
tiny random gpt-oss (its expert weights rounded to e2m1 codes with e8m0 block exponents, in
transformers' layout), and bulkrun loads the exact de-quantized weights (in fp32 and bf16), equal to
what transformers' own loader de-quantizes, generates greedily as transformers does from the same
checkpoint, and caches the converted weights."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers.models import VOCAB, build_tiny_model, hf_greedy
from safetensors.torch import save_file

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun.model import loader, mxfp4, weight_cache
from bulkrun_kernels import get_ops

CPU = torch.device("cpu")
PROJECTIONS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
# as openai/gpt-oss-20b's config.json has it
QUANTIZATION_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                               "lm_head"],
    "quant_method": "mxfp4",
}  # fmt: skip
_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def encode_mxfp4(weight: torch.Tensor):
    """transformers' expert parameter [E, cols, rows] -> (blocks [E, rows, cols/32, 16], scales
    [E, rows, cols/32], the exact value each code stands for, [E, cols, rows] fp32): per block of 32,
    the exponent that fits its largest magnitude within 6, each value rounded to the nearest code."""
    t = weight.detach().double().transpose(1, 2)
    experts, rows, cols = t.shape
    groups = t.reshape(experts, rows, cols // 32, 32)
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp_min(2.0**-100) / 6.0))
    scaled = groups / 2.0 ** exponent[..., None]
    code = (scaled.abs()[..., None] - _MAGNITUDES).abs().argmin(-1) + 8 * (scaled < 0)
    exact = _MAGNITUDES[code % 8] * torch.where(code >= 8, -1.0, 1.0) * 2.0 ** exponent[..., None]
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)  # the low nibble first
    scales = (exponent + 127).to(torch.uint8)
    return blocks, scales, exact.reshape(experts, rows, cols).transpose(1, 2).float()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(the MXFP4 model directory, its experts' exact de-quantized values by checkpoint name)."""
    root = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    hf = build_tiny_model("gpt_oss", root / "plain", eos_token_id=None)  # no early stop
    state, exact = {k: v.detach().clone() for k, v in hf.state_dict().items()}, {}
    for name in [n for n in state if n.endswith(PROJECTIONS)]:
        blocks, scales, exact[name] = encode_mxfp4(state.pop(name))
        state[f"{name}_blocks"], state[f"{name}_scales"] = blocks, scales
    folder = root / "mxfp4"
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((root / "plain" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"quantization_config": QUANTIZATION_CONFIG}))
    for path in (root / "plain").iterdir():
        if path.name not in ("config.json", "model.safetensors"):
            shutil.copy(path, folder / path.name)
    assert len(exact) == 2 * config["num_hidden_layers"]
    return folder, exact


def test_dequantize_equals_transformers_on_every_code_and_exponent():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    codes = torch.arange(256, dtype=torch.uint8).reshape(2, 4, 2, 16)  # every byte: every nibble pair
    scales = torch.stack([torch.arange(0, 256, 16), torch.arange(120, 136)]).to(torch.uint8).reshape(2, 4, 4)
    blocks = codes.repeat(1, 1, 2, 1)  # [2, 4, 4, 16]
    for dtype in (torch.bfloat16, torch.float32):
        ours, theirs = (
            mxfp4.dequantize(blocks, scales, dtype),
            convert_moe_packed_tensors(blocks, scales, dtype=dtype),
        )
        assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape == (2, 128, 4)
        assert torch.equal(ours.isnan(), theirs.isnan())
        assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())


def test_unpaired_or_duplicated_blocks_are_refused():
    name = "model.layers.0.mlp.experts.down_proj"
    load = lambda: torch.zeros(1)  # noqa: E731
    with pytest.raises(ValueError, match="down_proj_scales"):
        mxfp4.dequantizing({f"{name}_blocks": load}, torch.float32)
    with pytest.raises(ValueError, match="both"):
        mxfp4.dequantizing({name: load, f"{name}_blocks": load, f"{name}_scales": load}, torch.float32)
    plain = {name: load, "model.norm.weight": load}
    assert mxfp4.dequantizing(plain, torch.float32) == plain  # a projection stored unquantized loads as it is


def _ours(exact: torch.Tensor, name: str) -> torch.Tensor:
    """transformers' [E, in, out] expert weight in our layout: [E, out, in], gate rows then up rows."""
    w = exact.transpose(1, 2)
    return torch.cat((w[:, 0::2], w[:, 1::2]), dim=1) if name.endswith("gate_up_proj") else w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loaded_experts_are_the_exact_dequantized_values(checkpoint, dtype):
    folder, exact = checkpoint
    model = loader.load_model(folder, get_ops("reference"), dtype, CPU)
    assert model.cfg.quantization == "mxfp4"
    for layer, block in enumerate(model.layers):
        moe = block.mlp
        for param, projection in ((moe.w_gate_up, PROJECTIONS[0]), (moe.w_down, PROJECTIONS[1])):
            name = f"model.layers.{layer}.{projection}"
            assert param.dtype == dtype
            assert torch.equal(param, _ours(exact[name], name).to(dtype))  # representable: exact in bf16


def test_transformers_dequantizes_the_checkpoint_to_the_same_values(checkpoint):
    """transformers de-quantizes an MXFP4 checkpoint on a CPU without the `kernels` package."""
    from transformers import AutoModelForCausalLM

    folder, exact = checkpoint
    state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    for name, value in exact.items():
        assert torch.equal(state[name], value)


def test_greedy_equals_transformers_on_the_mxfp4_checkpoint(checkpoint):
    from transformers import AutoModelForCausalLM

    folder, _ = checkpoint
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 21, 40)]  # past window 8
    expected = hf_greedy(hf, prompts, 32)
    config = EngineConfig(dtype="float32", kernels="reference", max_num_batched_tokens=24, max_num_seqs=4,
                          kv_cache_bytes=8 << 20)  # fmt: skip
    engine = load_engine(str(folder), config)
    requests = [EngineRequest(f"p{i}", ids, SamplingParams(max_tokens=32, ignore_eos=True))
                for i, ids in enumerate(prompts)]  # fmt: skip
    outputs = sorted(engine.stream(requests), key=lambda o: int(o.request_id[1:]))
    assert [o.output_token_ids for o in outputs] == expected


def test_the_dequantized_weights_are_cached(checkpoint, tmp_path, monkeypatch):
    folder, _ = checkpoint
    monkeypatch.setenv("BULKRUN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(weight_cache, "MIN_BYTES", 0)
    ops = get_ops("reference")
    first = loader.load_model(folder, ops, torch.bfloat16, CPU)
    monkeypatch.setattr(loader, "_fill_from_checkpoint", lambda *a: pytest.fail("read the checkpoint again"))
    second = loader.load_model(folder, ops, torch.bfloat16, CPU)
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)
    assert second.layers[0].mlp.w_gate_up.dtype == torch.bfloat16
