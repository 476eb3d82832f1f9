"""Tiny random embedders saved as sentence-transformers directories (BERT, XLM-RoBERTa, a Qwen3
decoder), and the reference vectors they must give: sentence-transformers' own encode() in fp32 where
it is installed, else transformers' model with the same pooling computed here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = 120
WORDS = [f"w{i}" for i in range(VOCAB - 8)]


def word_texts(lengths: list[int], seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=n)) for n in lengths]


def _tokenizer(specials: list[str], template: tuple[str, str] | None, **names):
    """A whitespace word tokenizer: specials first, then the words; `template` (first, last) wraps texts."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(specials)}
    vocab |= {w: len(specials) + i for i, w in enumerate(WORDS)}
    tok = Tokenizer(WordLevel(vocab, unk_token=names["unk_token"]))
    tok.pre_tokenizer = Whitespace()
    if template is not None:
        first, last = template
        tok.post_processor = TemplateProcessing(
            single=f"{first} $A {last}", special_tokens=[(first, vocab[first]), (last, vocab[last])]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, **names), len(vocab)


def _scale_weights(model, seed: int) -> None:
    """Larger than transformers' init, so a wrong position, head or bias shows in the vectors."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else p.shape[-1] ** -0.5))


def write_st_files(folder: Path, pooling: str, normalize: bool, max_seq_length: int | None,
                   prompts: dict | None = None) -> None:  # fmt: skip
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]  # fmt: skip
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    modes = {
        "mean": "pooling_mode_mean_tokens",
        "cls": "pooling_mode_cls_token",
        "last": "pooling_mode_lasttoken",
    }
    config = {"word_embedding_dimension": 64} | {key: key == modes[pooling] for key in modes.values()}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts or {}}))


def build_encoder(kind: str, folder: Path, *, pooling="mean", normalize=True, max_seq_length=24,
                  seed=0, sentence_transformers=True) -> Path:  # fmt: skip
    """A 2-layer random BERT ("bert") or XLM-RoBERTa ("xlm-roberta") as a sentence-transformers dir."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    if kind == "bert":
        tokenizer, vocab = _tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], ("[CLS]", "[SEP]"),
                                      unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]")  # fmt: skip
        config = transformers.BertConfig(pad_token_id=0, max_position_embeddings=40)
    else:
        tokenizer, vocab = _tokenizer(["<s>", "<pad>", "</s>", "<unk>"], ("<s>", "</s>"), unk_token="<unk>",
                                      pad_token="<pad>", bos_token="<s>", eos_token="</s>")  # fmt: skip
        config = transformers.XLMRobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                               max_position_embeddings=42)  # fmt: skip
    for key, value in dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=96, type_vocab_size=2).items():  # fmt: skip
        setattr(config, key, value)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager", add_pooling_layer=False)
    _scale_weights(model, seed)
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if sentence_transformers:
        write_st_files(folder, pooling, normalize, max_seq_length)
    return folder


def build_qwen3_embedder(folder: Path, *, seed=0, max_seq_length=48, prompts=None) -> Path:
    """A 2-layer random Qwen3 decoder embedder (last-token pooling, normalized; the tokenizer appends
    an end token, as Qwen3-Embedding's does)."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer, vocab = _tokenizer(["<|endoftext|>", "<unk>"], None, unk_token="<unk>",
                                  pad_token="<|endoftext|>", eos_token="<|endoftext|>")  # fmt: skip
    from tokenizers.processors import TemplateProcessing

    backend = tokenizer.backend_tokenizer
    backend.post_processor = TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)]
    )
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>",
                                                     pad_token="<|endoftext|>", eos_token="<|endoftext|>")  # fmt: skip
    config = transformers.Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=0,
                                      pad_token_id=0)  # fmt: skip
    model = transformers.AutoModel.from_config(config, attn_implementation="eager")
    _scale_weights(model, seed)
    model.eval().save_pretrained(folder)
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(folder)
    write_st_files(folder, "last", True, max_seq_length, prompts)
    return folder


def have_sentence_transformers() -> bool:
    try:
        import sentence_transformers  # noqa: F401
    except Exception:
        return False
    return True


def reference_vectors(model_dir: Path, texts: list[str], *, pooling="mean", normalize=True,
                      max_length=None, prompt="") -> np.ndarray:  # fmt: skip
    """fp32 vectors of `texts` as sentence-transformers makes them (its encode() when installed)."""
    texts = [prompt + t for t in texts]
    if have_sentence_transformers() and (model_dir / "modules.json").is_file():
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(model_dir), device="cpu")
        if max_length is not None:
            model.max_seq_length = max_length
        return model.encode(texts, batch_size=4, convert_to_numpy=True)
    return _transformers_vectors(model_dir, texts, pooling, normalize, max_length)


def _transformers_vectors(model_dir, texts, pooling, normalize, max_length) -> np.ndarray:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for text in texts:  # one at a time: no padding to account for
            ids = tokenizer(
                text, truncation=max_length is not None, max_length=max_length, return_tensors="pt"
            )
            h = model(**ids).last_hidden_state[0]
            v = {"mean": h.mean(0), "cls": h[0], "last": h[-1]}[pooling]
            out.append(torch.nn.functional.normalize(v, dim=0) if normalize else v)
    return torch.stack(out).numpy()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
