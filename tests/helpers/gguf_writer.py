"""Write a saved tiny HF checkpoint (tests/helpers/models.py) as a GGUF file, the way llama.cpp's
convert_hf_to_gguf.py does, so the GGUF tests read what a published file holds:
- the metadata keys llama.cpp writes for the architecture (gguf.Keys, through GGUFWriter.add_*);
- tensor names from gguf's own map (gguf.get_tensor_name_map), experts stacked per layer;
- the transforms llama.cpp applies, which a GGUF loader must undo: the q/k row permutation of the
  `llama` architecture, Gemma's norm weights stored as 1 + w, gpt-oss's interleaved gate/up split;
- a byte-level (`gpt2`) vocabulary from the checkpoint's tokenizer, specials marked CONTROL.
Tensors are F32 by default; `qtype` quantizes the matrices as llama.cpp does (1-D tensors, norms and
routers stay F32)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

F32 = gguf.GGMLQuantizationType.F32
# HF model_type -> the llama.cpp architecture its converter writes (Mixtral is `llama` with experts)
ARCHS = {
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
    "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE,
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "gpt_oss": gguf.MODEL_ARCH.GPT_OSS,
    "mixtral": gguf.MODEL_ARCH.LLAMA,
}
_EXPERT = re.compile(r"model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")


def write_gguf(model_dir: Path, out: Path, qtype: gguf.GGMLQuantizationType = F32) -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    arch = ARCHS[config["model_type"]]
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(model_dir.name)
    _write_hparams(writer, config, arch)
    _write_vocab(writer, model_dir)
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    for hf_name, data in _hf_tensors(load_file(str(model_dir / "model.safetensors")), config, arch):
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise KeyError(f"gguf has no tensor name for {hf_name}")
        data = data.squeeze()  # as llama.cpp does: Qwen2-MoE's shared_expert_gate [1, H] is stored [H]
        keep_f32 = data.ndim <= 1 or name.endswith(("_norm.weight", "ffn_gate_inp.weight", ".bias"))
        kind = F32 if keep_f32 else qtype
        writer.add_tensor(name, gguf.quants.quantize(data.astype(np.float32), kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_hparams(w: gguf.GGUFWriter, c: dict, arch: gguf.MODEL_ARCH) -> None:
    """TextModel.set_gguf_parameters and each architecture's additions."""
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if c.get("head_dim"):
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
    rope = c.get("rope_parameters") or {}
    global_rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(global_rope["rope_theta"])
    if "sliding_attention" in rope:
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if global_rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(global_rope["factor"])
    elif global_rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(global_rope["factor"])
        w.add_rope_scaling_orig_ctx_len(global_rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(global_rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(global_rope["beta_slow"])
    if experts := c.get("num_local_experts") or c.get("num_experts"):
        w.add_expert_count(experts)
        w.add_expert_used_count(c["num_experts_per_tok"])
    if c.get("moe_intermediate_size"):
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if c.get("shared_expert_intermediate_size"):
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    if arch == gguf.MODEL_ARCH.GEMMA2:
        w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
    if c.get("final_logit_softcapping") and arch == gguf.MODEL_ARCH.GEMMA3:
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
    if c.get("sliding_window") and arch != gguf.MODEL_ARCH.LLAMA:
        w.add_sliding_window(c["sliding_window"])
    if arch == gguf.MODEL_ARCH.PHI3:
        w.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
        w.add_rope_scaling_orig_ctx_len(c["original_max_position_embeddings"])
    if arch == gguf.MODEL_ARCH.GPT_OSS:
        w.add_expert_feed_forward_length(c["intermediate_size"])
    if arch == gguf.MODEL_ARCH.LLAMA:
        w.add_vocab_size(c["vocab_size"])
        w.add_rope_dimension_count(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def _write_vocab(w: gguf.GGUFWriter, model_dir: Path) -> None:
    """A byte-level vocabulary (`_set_vocab_gpt2`): the tokens in id order, specials as CONTROL."""
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"] | {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    specials = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens = sorted(vocab, key=vocab.get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    # a word vocabulary has no merges; scores let transformers derive them (it needs one or the other)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    special = json.loads((model_dir / "tokenizer_config.json").read_text())
    for key, add in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id),
                     ("pad_token", w.add_pad_token_id), ("unk_token", w.add_unk_token_id)):  # fmt: skip
        if special.get(key):
            add(vocab[special[key]])


def _hf_tensors(tensors: dict, c: dict, arch: gguf.MODEL_ARCH):
    """(HF name, array) in what llama.cpp's modify_tensors yields, for gguf's name map."""
    experts: dict[tuple, list] = {}
    for name, data in tensors.items():
        if m := _EXPERT.fullmatch(name):  # one expert's matrix: stacked with its layer's others
            layer, block, _, proj = m.groups()
            experts.setdefault((layer, block, proj), []).append((int(m.group(3)), data))
            continue
        if arch == gguf.MODEL_ARCH.GPT_OSS and ".mlp.experts." in name:
            yield from _gpt_oss_experts(name, data)
            continue
        if name.endswith(".self_attn.sinks"):
            name += ".weight"
        if arch in (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3):
            if name == "lm_head.weight":
                continue  # tied; llama.cpp skips it
            if name.endswith("norm.weight"):
                data = data + 1  # Gemma's RMSNorm multiplies by (1 + w)
        if arch == gguf.MODEL_ARCH.LLAMA and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c["num_attention_heads"] if "q_proj" in name else c["num_key_value_heads"]
            data = _permute(data, heads)
        yield name, data
    for (layer, block, proj), stack in experts.items():
        data = np.stack([d for _, d in sorted(stack, key=lambda e: e[0])])
        yield f"model.layers.{layer}.{block}.experts.{proj}.weight", data


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """LlamaModel.permute: each head's rotary halves interleaved, as llama.cpp's rope wants them."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gpt_oss_experts(name: str, data: np.ndarray):
    """GptOssModel.modify_tensors on de-quantized experts: x @ W layout transposed to [E, out, in],
    gate / up split from their interleaved columns."""
    prefix = name.rsplit(".", 1)[0]  # model.layers.{i}.mlp.experts
    if name.endswith("down_proj"):
        yield f"{prefix}.down_proj.weight", data.swapaxes(-1, -2)
    elif name.endswith("down_proj_bias"):
        yield f"{prefix}.down_proj.bias", data
    elif name.endswith("gate_up_proj"):
        data = data.swapaxes(-1, -2)
        yield f"{prefix}.gate_proj.weight", data[:, ::2]
        yield f"{prefix}.up_proj.weight", data[:, 1::2]
    elif name.endswith("gate_up_proj_bias"):
        yield f"{prefix}.gate_proj.bias", data[..., ::2]
        yield f"{prefix}.up_proj.bias", data[..., 1::2]
