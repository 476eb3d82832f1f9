"""Test helpers for the job layer: a tiny random Llama with a byte-level tokenizer and a chat
template (real engine, seconds to run), and a FakeEngine with the Engine API (no model at all)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from bulkrun.engine.outputs import RequestOutput, StepStats
from bulkrun.engine.params import EngineRequest

SPECIALS = ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer():
    """A byte-level BPE tokenizer with no merges: every text encodes, decoding round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for name in SPECIALS:
        vocab[name] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(directory: Path, max_positions: int = 512, seed: int = 0) -> Path:
    """Save a random 2-layer Llama (hidden 32) with the byte tokenizer into `directory`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


class FakeEngine:
    """The Engine API with no model: outputs are a hash of (prompt, seed), steps finish requests
    in a scrambled order, capacity is limited so backpressure is exercised."""

    def __init__(self, tokenizer, max_model_len: int = 512, max_waiting: int = 8, per_step: int = 3):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.max_waiting = max_waiting
        self.per_step = per_step
        self.waiting: list[EngineRequest] = []
        self.last_stats = StepStats(kv_blocks_total=100)
        self.totals: dict = {}
        self.added = 0
        self.steps = 0
        self._rng = random.Random(1234)

    def add_request(self, req: EngineRequest) -> None:
        if not req.prompt_token_ids:
            raise ValueError("empty prompt")
        self.waiting.append(req)
        self.added += 1

    def has_capacity(self) -> bool:
        return len(self.waiting) < self.max_waiting

    def has_unfinished(self) -> bool:
        return bool(self.waiting)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        self._rng.shuffle(self.waiting)
        done, self.waiting = self.waiting[: self.per_step], self.waiting[self.per_step :]
        self.last_stats = StepStats(
            num_scheduled_tokens=sum(len(r.prompt_token_ids) for r in done),
            num_running=len(done),
            kv_blocks_used=len(done),
            kv_blocks_total=100,
        )
        return [self._output(r) for r in done]

    def _output(self, req: EngineRequest) -> RequestOutput:
        if req.continuations is not None:
            scores = [[-float(len(c))] * len(c) for c in req.continuations]
            return RequestOutput(req.request_id, req.prompt_token_ids, finish_reason="scored",
                                 continuation_logprobs=scores)  # fmt: skip
        key = json.dumps([req.prompt_token_ids, req.params.seed, req.params.temperature])
        digest = hashlib.sha256(key.encode()).hexdigest()
        n = min(req.params.max_tokens, 4)
        text = digest[: 2 * n]
        ids = [int(digest[i : i + 2], 16) for i in range(0, 2 * n, 2)]
        return RequestOutput(req.request_id, req.prompt_token_ids, ids, text, "length")


def write_jsonl(path: Path, rows: list) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def texts(n: int, start: int = 0) -> list[dict]:
    """Rows of varied length with string ids."""
    return [{"id": f"r{i}", "text": f"row {i} " + "word " * (i % 7 + 1)} for i in range(start, start + n)]
