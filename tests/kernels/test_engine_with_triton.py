"""The engine runs the whole model on the Triton kernels (interpreted on the CPU) and generates what it
generates on the reference ops: the kernels work with the model's real tensor layouts (q/k/v as views
of one fused projection, per-head q/k norms), chunked prefill mixed with decode rows, and preemption-free
continuous batching."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun_kernels import paged_attention as attention_module

VOCAB = 64
COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
)  # fmt: skip


def save_tiny_model(folder) -> None:
    # Qwen3 exercises the most kernel paths: per-head q/k norms, head_dim != hidden / heads, GQA.
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=False))
    with torch.no_grad():  # larger than the default init, so greedy choices are not near-ties
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w2").save_pretrained(folder)


def generate(folder, kernels: str, device: str):
    # A small token budget splits the long prompt into chunks that share steps with decode rows.
    config = EngineConfig(device=device, dtype="float32", kernels=kernels, max_num_batched_tokens=16, block_size=4,
                          kv_cache_bytes=2**20, enable_prefix_caching=False)  # fmt: skip
    engine = load_engine(str(folder), config)
    assert engine.runner.ops.backend == kernels
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 21, 1, 9)]
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=True)
    outs = engine.generate([EngineRequest(f"r{i}", p, params) for i, p in enumerate(prompts)])
    return [o.output_token_ids for o in outs], [o.logprobs for o in outs]


@pytest.mark.parametrize("split", [False, True], ids=["planned", "split-kv"])
def test_triton_engine_generates_like_reference(device, tmp_path, split, monkeypatch):
    if split:  # every attention call through the split-KV kernels, with the model's real layouts
        monkeypatch.setattr(attention_module, "plan_partitions", lambda *args: 3)
    save_tiny_model(tmp_path)
    want_tokens, want_logprobs = generate(tmp_path, "reference", device)
    got_tokens, got_logprobs = generate(tmp_path, "triton", device)
    assert got_tokens == want_tokens
    for got, want in zip(got_logprobs, want_logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-3, rtol=1e-3)
