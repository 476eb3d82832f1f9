"""Shared benchmark helpers: a deterministic chat workload and the machine's own matmul rate."""

from __future__ import annotations

import random
import time

import torch

_WORDS = (
    "order invoice refund shipping account password login error crash update feature request billing "
    "payment card charge delivery package tracking warehouse customer support ticket reply agent answer "
    "question report summary archive document chapter section paragraph data model system network server "
    "latency throughput memory cache batch queue schedule token prompt output result engine kernel"
).split()
_TASKS = (
    "Summarize the following support conversation in two sentences.",
    "Classify the tone of this message and explain why.",
    "Write a short reply to this customer.",
    "List the three most important facts in this text.",
    "Translate the key request in this note into plain English.",
)


def chat_prompts(tokenizer, n: int = 48, lo: int = 50, hi: int = 400, seed: int = 0) -> list[list[int]]:
    """`n` chat-templated prompts whose token lengths spread evenly over [lo, hi]."""
    return [_encode_chat(tokenizer, text) for text in chat_texts(tokenizer, n, lo, hi, seed)]


def chat_texts(tokenizer, n: int = 48, lo: int = 50, hi: int = 400, seed: int = 0) -> list[str]:
    """The user messages of chat_prompts (the same order), e.g. as rows for the CLI."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        target = lo + (hi - lo) * i // max(1, n - 1)
        words = [rng.choice(_WORDS) for _ in range(target)]
        text = f"{rng.choice(_TASKS)}\n\n{' '.join(words)}"
        ids = _encode_chat(tokenizer, text)
        while len(ids) > target and len(words) > 1:  # trim to the target length
            words = words[: max(1, len(words) - max(1, (len(ids) - target)))]
            text = f"{_TASKS[i % len(_TASKS)]}\n\n{' '.join(words)}"
            ids = _encode_chat(tokenizer, text)
        texts.append(text)
    rng.shuffle(texts)  # arrival order is not sorted; the engine must cope
    return texts


def shared_prefix_prompts(
    tokenizer, n: int = 48, instruction_words: int = 300, seed: int = 1
) -> list[list[int]]:
    """Prompts that share one long instruction and differ only in a short item."""
    rng = random.Random(seed)
    instruction = "You are a careful analyst. " + " ".join(
        rng.choice(_WORDS) for _ in range(instruction_words)
    )
    items = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(10, 40))) for _ in range(n)]
    return [_encode_chat(tokenizer, f"{instruction}\n\nItem: {item}") for item in items]


def _encode_chat(tokenizer, text: str) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def matmul_gflops(
    n: int = 1024, repeats: int = 15, warmup_s: float = 0.5, dtype=torch.float32, budget_s: float = 20.0
) -> float:
    """The machine's own matmul rate (GFLOP/s) in `dtype`, measured in this process: the best of `repeats`
    products after `warmup_s` of them, or of those that fit in `budget_s` (bf16 without native bf16
    instructions runs a 2048^3 product for tens of seconds). The best, not the median: noise only ever
    slows a product, and a low rate would flatter bulkrun."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    start = time.perf_counter()
    end = start + warmup_s
    while time.perf_counter() < end:  # wake the thread pool and the clocks
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
        if t0 + times[-1] - start > budget_s:
            break
    return 2 * n**3 / min(times) / 1e9


def matmul_params(config) -> tuple[int, int]:
    """(the decoder layers' matmul parameters, the LM head's) of a dense HF config."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    inter = config.intermediate_size
    per_layer = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h + 3 * h * inter
    return layers * per_layer, h * config.vocab_size


def model_flops_per_token(config, context: float) -> float:
    """Approximate forward FLOPs for one token: 2 * matmul params + attention over `context` tokens."""
    body, head = matmul_params(config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    attention = config.num_hidden_layers * 4 * heads * head_dim * context
    return 2 * (body + head) + attention


def model_flops(config, computed_prompt_tokens: float, generated: float, context: float) -> float:
    """Approximate forward FLOPs of a generation job: every computed token (prompt tokens not served
    by a prefix cache, and the generated ones) through the layers' matmuls and attention over
    `context` tokens; the LM head for the generated tokens only (a prompt's last row gives the first)."""
    _, head = matmul_params(config)
    without_head = model_flops_per_token(config, context) - 2 * head
    return (computed_prompt_tokens + generated) * without_head + generated * 2 * head
