"""Helpers for the distributed tests: a tiny random model the real engine runs in seconds, an input
file, and readers for what a job left in its output directory."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from bulkrun.io.shards import RESULTS_DIR, shard_paths, shard_rows


def make_tiny_model(directory: Path) -> Path:
    """A random 2-layer Llama (hidden 32) with a byte-level tokenizer: every text encodes."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|end|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    directory.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def write_rows(path: Path, count: int) -> Path:
    """JSONL rows of varied lengths (so windows sort and batches mix), ids r0, r1, ..."""
    with open(path, "w") as f:
        for row in range(count):
            text = " ".join(f"word{row}-{k}" for k in range(1 + row % 7))
            f.write(json.dumps({"id": f"r{row}", "text": text}) + "\n")
    return path


def read_results(out: Path) -> list[dict]:
    with open(Path(out) / "results.jsonl") as f:
        return [json.loads(line) for line in f]


def committed_rows(out: Path) -> list[int]:
    """Rows of every committed result shard, duplicates included."""
    return [row for path in shard_paths(Path(out) / RESULTS_DIR) for row in shard_rows(path)]


def duplicated_rows(out: Path) -> list[int]:
    return sorted(row for row, times in Counter(committed_rows(out)).items() if times > 1)


def spec_values(source: str, args: list[str], out: str, **extra) -> dict:
    """The tiny job's CLI arguments (`--flag value` pairs and bare flags) as job-spec values."""
    values: dict = {"task": "generate", "input": source, "out": out}
    rest = list(args)
    while rest:
        flag = rest.pop(0).removeprefix("--")
        if flag.startswith("no-"):
            values[flag[3:].replace("-", "_")] = False
        elif not rest or rest[0].startswith("--"):
            values[flag.replace("-", "_")] = True
        else:
            value = rest.pop(0)
            values[flag.replace("-", "_")] = (
                int(value) if value.isdigit() and flag != "checkpoint-every" else value
            )
    return values | extra
