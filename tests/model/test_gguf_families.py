"""Every family transformers' GGUF converter knows, from a GGUF file written the way llama.cpp writes
one (tests/helpers/gguf_writer.py), through bulkrun's own path: resolve_model converts the .gguf
into a cached directory whose config reads as the checkpoint's (ModelConfig equal), whose weights
load exactly as the checkpoint's, and whose fp32 greedy output equals transformers' on the original
model. A Q8_0 file loads its de-quantized values; the files the converter would turn into another
model are refused by name."""

from __future__ import annotations

import gguf
import pytest
import torch
from helpers.gguf_writer import write_gguf
from helpers.models import VOCAB, build_tiny_model, hf_greedy

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun.model.config import ModelConfig
from bulkrun.model_source import CACHE_ENV, ModelNotFound, resolve_model

NEW_TOKENS = 8
# What a GGUF can state, beside build_tiny_model's shapes: llama.cpp scales Gemma's queries by
# head_dim ** -0.5 (no query_pre_attn_scalar key) and its qwen3moe has experts in every layer.
GGUF_SHAPES = {
    "gemma2": dict(query_pre_attn_scalar=16),
    "gemma3": dict(query_pre_attn_scalar=256),
    "qwen3_moe": dict(mlp_only_layers=[]),
    "qwen2_moe": {},
    "phi3": {},
}
REFUSED = {"mixtral": "Mixtral-style", "gpt_oss": "gpt-oss"}


def _config() -> EngineConfig:
    return EngineConfig(dtype="float32", device="cpu", kernels="reference", max_num_batched_tokens=64,
                        max_num_seqs=4, kv_cache_bytes=4 << 20)  # fmt: skip


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (4, 13)]  # past window 8


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
        yield


def _build(kind: str, tmp_path_factory, qtype=gguf.GGMLQuantizationType.F32, **shape):
    folder = tmp_path_factory.mktemp(kind) / kind  # the folder's name is the file's general.name
    hf = build_tiny_model(kind, folder, **shape)
    return hf, folder, write_gguf(folder, folder.parent / f"{kind}-{qtype.name}.gguf", qtype)


@pytest.fixture(scope="module", params=sorted(GGUF_SHAPES))
def family(request, tmp_path_factory, cache):
    hf, folder, path = _build(request.param, tmp_path_factory, **GGUF_SHAPES[request.param])
    return hf, folder, resolve_model(str(path))


def _params(model_dir) -> dict[str, torch.Tensor]:
    return dict(load_engine(str(model_dir), _config()).runner.model.named_parameters())


def test_converted_config_reads_as_the_checkpoints(family):
    _, folder, converted = family
    assert converted.parent.name == "models" and (converted / "config.json").is_file()
    assert ModelConfig.from_model_dir(converted) == ModelConfig.from_model_dir(folder)


def test_weights_load_exactly_as_the_checkpoints(family):
    _, folder, converted = family
    expected, loaded = _params(folder), _params(converted)
    assert loaded.keys() == expected.keys()
    unequal = [name for name, p in expected.items() if not torch.equal(loaded[name], p)]
    assert unequal == []


def test_greedy_equals_transformers_on_the_original(family):
    hf, _, converted = family
    engine = load_engine(str(converted), _config())
    requests = [EngineRequest(f"p{i}", ids, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
                for i, ids in enumerate(_prompts())]  # fmt: skip
    outputs = sorted(engine.stream(requests), key=lambda o: o.request_id)
    assert [o.output_token_ids for o in outputs] == hf_greedy(hf, _prompts(), NEW_TOKENS)


def test_tokenizer_keeps_the_vocabulary_and_specials(family):
    from transformers import AutoTokenizer

    _, folder, converted = family
    original, read = AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(converted)
    # transformers' GGUF tokenizer adds its class defaults (<|endoftext|>, <mask>) a vocabulary lacks
    assert {t: i for t, i in read.get_vocab().items() if i < VOCAB} == original.get_vocab()
    assert (read.bos_token, read.eos_token, read.pad_token) == ("<s>", "</s>", "<pad>")


def test_q8_0_file_loads_its_dequantized_values(tmp_path_factory, cache):
    """Matrices are quantized in blocks of 32 along each row, so fusing rows (q/k/v) or stacking
    experts commutes with it: each loaded matrix is the Q8_0 round trip of the checkpoint's."""
    q8 = gguf.GGMLQuantizationType.Q8_0
    _, folder, path = _build("qwen3_moe", tmp_path_factory, q8, **GGUF_SHAPES["qwen3_moe"])
    expected, loaded = _params(folder), _params(resolve_model(str(path)))
    quantized = [n for n, p in expected.items() if p.dim() >= 2 and not n.endswith("router.weight")]
    assert "embed_tokens" in quantized and any("w_gate_up" in n for n in quantized)
    for name, p in expected.items():
        if name in quantized:
            roundtrip = gguf.quants.dequantize(gguf.quants.quantize(p.numpy(), q8), q8)
            assert torch.equal(loaded[name], torch.from_numpy(roundtrip)), name
            # half a step of the row's largest block scale, plus that scale's float16 rounding
            amax = p.abs().amax(dim=-1, keepdim=True)
            assert not torch.equal(loaded[name], p)
            assert ((loaded[name] - p).abs() <= amax / 127 / 2 + amax * 2**-10).all(), name
        else:  # norms and routers stay F32
            assert torch.equal(loaded[name], p), name


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_gguf_the_converter_would_misread_is_refused(kind, tmp_path_factory, cache):
    _, _, path = _build(kind, tmp_path_factory)
    with pytest.raises(ModelNotFound, match=REFUSED[kind]):
        resolve_model(str(path))
