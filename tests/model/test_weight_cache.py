"""The converted-weight cache: the first CPU load writes it, the next maps it (never touching the
checkpoint) and computes the same logits; a changed checkpoint or dtype gets its own file, and a
file that does not fit the model is ignored."""

from __future__ import annotations

import pytest
import torch
from helpers.models import build_tiny_model

from bulkrun.model import loader, weight_cache
from bulkrun.model.attention_metadata import AttentionMetadata
from bulkrun_kernels import get_ops

CPU = torch.device("cpu")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKRUN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(weight_cache, "MIN_BYTES", 0)  # tiny models are cached too
    return tmp_path / "cache"


def _logits(model) -> torch.Tensor:
    n, block = 6, 8
    md = AttentionMetadata(
        positions=torch.arange(n),
        slot_mapping=torch.arange(n),
        block_tables=torch.zeros(1, 1, dtype=torch.int32),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
    )
    cfg = model.cfg
    kv = [
        (torch.zeros(1, block, cfg.num_kv_heads, cfg.head_dim, dtype=model.norm.dtype),) * 2
        for _ in range(cfg.num_layers)
    ]
    kv = [(k, k.clone()) for k, _ in kv]
    return model(torch.tensor([5, 9, 3, 40, 7, 11]), md, kv, torch.tensor([n - 1]))


@pytest.mark.parametrize("kind", ["llama", "llama_untied"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_second_load_maps_the_cached_weights(kind, dtype, tmp_path, cache_dir, monkeypatch):
    build_tiny_model(kind, tmp_path / "m")
    ops = get_ops("reference")
    first = loader.load_model(tmp_path / "m", ops, dtype, CPU)
    files = list((cache_dir / "weights").glob("*.safetensors"))
    assert len(files) == 1

    def no_checkpoint(*args):
        raise AssertionError("the checkpoint was read although the cache holds it")

    monkeypatch.setattr(loader, "_fill_from_checkpoint", no_checkpoint)
    second = loader.load_model(tmp_path / "m", ops, dtype, CPU)
    # every weight, converted or mapped, starts on a 64-byte boundary: a misaligned one (a view of a
    # safetensors file, whose header is padded to 8 bytes) takes another reduction order in MKL's
    # fp32 gemv on AMD, and so gave other logits
    assert all(p.data_ptr() % weight_cache.ALIGN == 0 for m in (first, second) for p in m.parameters())
    assert torch.equal(_logits(first), _logits(second))
    assert second.layers[0].attn.qkv.weight.dtype == dtype
    assert second.embed_tokens.dtype == torch.float32  # kept fp32 on the CPU, as the loader stores it
    if kind == "llama":
        assert second.lm_head.weight is second.embed_tokens


def test_the_cache_file_is_plain_safetensors(tmp_path, cache_dir):
    from safetensors.torch import load_file

    build_tiny_model("qwen3", tmp_path / "m")
    model = loader.load_model(tmp_path / "m", get_ops("reference"), torch.bfloat16, CPU)
    (path,) = (cache_dir / "weights").glob("*.safetensors")
    stored = {n: t for n, t in load_file(str(path)).items() if not n.startswith("__pad")}
    params = dict(model.named_parameters())
    assert stored.keys() == params.keys()
    assert all(torch.equal(stored[n], params[n]) for n in params)


def test_dtype_and_changed_checkpoint_get_their_own_files(tmp_path, cache_dir):
    build_tiny_model("llama", tmp_path / "m")
    ops = get_ops("reference")
    loader.load_model(tmp_path / "m", ops, torch.float32, CPU)
    loader.load_model(tmp_path / "m", ops, torch.bfloat16, CPU)
    build_tiny_model("llama", tmp_path / "m", seed=1)  # new weights, same names
    changed = loader.load_model(tmp_path / "m", ops, torch.float32, CPU)
    assert len(list((cache_dir / "weights").glob("*.safetensors"))) == 3
    fresh = loader._fill_from_checkpoint  # what the checkpoint itself says
    want = loader.LlamaForCausalLM(changed.cfg, ops)
    fresh(want, tmp_path / "m", changed.cfg, torch.float32, CPU)
    assert torch.equal(want.embed_tokens, changed.embed_tokens)


def test_a_cache_file_for_another_model_is_ignored_and_replaced(tmp_path, cache_dir):
    build_tiny_model("llama", tmp_path / "m")
    build_tiny_model("qwen3", tmp_path / "other")
    ops = get_ops("reference")
    path = weight_cache.cache_path(tmp_path / "m", torch.float32)
    other = loader.load_model(tmp_path / "other", ops, torch.float32, CPU)
    weight_cache.write(path, dict(other.named_parameters()))  # the wrong model's weights at m's key
    model = loader.load_model(tmp_path / "m", ops, torch.float32, CPU)  # ignores, then rewrites it
    empty = loader.LlamaForCausalLM(model.cfg, ops)
    assert loader._fill_from_cache(empty, path, torch.float32, CPU)
    assert torch.equal(empty.embed_tokens, model.embed_tokens)
