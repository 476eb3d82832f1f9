"""End to end on the default model: our engine's greedy tokens equal transformers' own `generate`.

transformers runs each prompt alone (batch 1, greedy); our engine runs them all together, with
chunked prefill, with a KV budget so small that requests are preempted and recomputed, and with
prompts sharing a long prefix through the prefix cache. fp32 everywhere: any difference is a bug.
"""

from __future__ import annotations

import pytest
import torch

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.engine.load import load_engine
from bulkrun.engine.worker.kv_cache import bytes_per_block
from bulkrun.model.config import ModelConfig

pytestmark = pytest.mark.slow
MAX_NEW_TOKENS = 16

_HISTORY = (
    "The history of computing spans several centuries. Early mechanical calculators such as the "
    "Pascaline and the Leibniz wheel performed arithmetic with gears. In the nineteenth century "
    "Charles Babbage designed the Difference Engine and the Analytical Engine, and Ada Lovelace wrote "
    "what many consider the first program. The twentieth century brought electromechanical machines, "
    "then vacuum tubes, transistors and integrated circuits. Each step made machines smaller, faster "
    "and cheaper. Mainframes filled rooms and served whole companies; minicomputers brought computing "
    "to laboratories; personal computers put it on every desk. Networks then connected these machines, "
    "and the internet joined the networks into one. Today a phone in a pocket holds more computing "
    "power than the machines that guided the first moon landing, and data centres with millions of "
    "processors train models on a large part of the written text humanity has produced. "
)
_CODE = '''def merge_sorted(a: list[int], b: list[int]) -> list[int]:
    """Merge two sorted lists into one sorted list."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out


class LRUCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items: dict[str, int] = {}

    def get(self, key: str) -> int | None:
        if key not in self.items:
            return None
        value = self.items.pop(key)
        self.items[key] = value
        return value

    def put(self, key: str, value: int) -> None:
        self.items.pop(key, None)
        self.items[key] = value
        if len(self.items) > self.capacity:
'''
CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a ten-year-old.",
    "Quelle est la meilleure façon d'apprendre une nouvelle langue ?",
    "Wie funktioniert ein Kühlschrank?",
    "¿Cuáles son los planetas del sistema solar?",
    "用一句话介绍长城。",
    "日本の首都はどこですか？",
    "Расскажи коротко о Москве.",
    "Give me three tips for writing clean Python code.",
    "Write a SQL query that counts orders per customer.",
    "Summarize this text in two sentences:\n\n" + _HISTORY * 2,
    "hi",
]
RAW = [
    "Once upon a time",
    "The quick brown fox",
    "def fibonacci(n):",
    "SELECT name, COUNT(*) FROM users",
    "Le soleil se lève",
    _CODE,
    _HISTORY * 3,
    "1, 2, 3, 4, 5,",
]
_INSTRUCTION = (
    "You are a support assistant for an online shop. Classify each customer message as billing, "
    "shipping, returns, account or other, and explain your choice in one short sentence. "
) + _HISTORY
SHARED = [
    "My card was charged twice for one order.",
    "Where is my parcel? It has been two weeks.",
    "I want to send these shoes back.",
    "I forgot my password and cannot log in.",
    "Do you sell gift cards?",
    "The invoice shows the wrong address.",
]


@pytest.fixture(scope="module")
def model_dir() -> str:
    from bulkrun.model_source import resolve_model

    return str(resolve_model(None))


@pytest.fixture(scope="module")
def prompts(model_dir) -> dict[str, list[list[int]]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)

    def chat(text: str, system: str | None = None) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}
        ]
        return list(
            tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )

    return {
        "varied": [chat(t) for t in CHAT] + [tok.encode(t) for t in RAW],
        "shared": [chat(t, system=_INSTRUCTION) for t in SHARED],
    }


@pytest.fixture(scope="module")
def expected(model_dir, prompts) -> dict[str, list[list[int]]]:
    """transformers' greedy continuation of each prompt alone (computed once per session)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = {}
    for name, group in prompts.items():
        out[name] = []
        for ids in group:
            with torch.no_grad():
                seq = model.generate(
                    torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                )  # fmt: skip
            out[name].append(seq[0, len(ids) :].tolist())
    return out


def _generate(model_dir: str, prompts: list[list[int]], **config) -> tuple[list[list[int]], dict]:
    """Outputs in prompt order, and the run's figures summed over its steps."""
    engine = load_engine(model_dir, EngineConfig(**{"dtype": "float32", **config}))
    requests = [
        EngineRequest(f"p{i}", ids, SamplingParams(max_tokens=MAX_NEW_TOKENS))
        for i, ids in enumerate(prompts)
    ]
    steps = []
    outputs = sorted(engine.stream(requests, on_step=steps.append), key=lambda o: int(o.request_id[1:]))
    assert all(o.finish_reason in ("stop", "length") for o in outputs), [o.error for o in outputs]
    totals = {
        "preemptions": sum(s.num_preempted for s in steps),
        "prefix_cache_hit_tokens": sum(s.prefix_cache_hit_tokens for s in steps),
    }
    return [o.output_token_ids for o in outputs], totals


def test_prompts_cover_the_required_spread(prompts):
    varied = prompts["varied"]
    assert len(varied) + len(prompts["shared"]) >= 20
    assert max(len(p) for p in varied) >= 300 and min(len(p) for p in varied) <= 5


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_all_prompts_together_match_transformers(model_dir, prompts, expected, async_scheduling):
    # A small token budget so long prompts arrive in chunks among the others' decode steps.
    got, totals = _generate(
        model_dir, prompts["varied"], max_num_batched_tokens=256, async_scheduling=async_scheduling
    )
    assert got == expected["varied"]
    assert totals["preemptions"] == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preemption_and_recompute_keep_greedy_output(model_dir, prompts, expected, async_scheduling):
    cfg = ModelConfig.from_model_dir(model_dir)
    longest = max(len(p) for p in prompts["varied"]) + MAX_NEW_TOKENS
    blocks = -(-longest // 16) + 3  # the longest fits, but nowhere near all of them at once
    got, totals = _generate(
        model_dir, prompts["varied"], kv_cache_bytes=blocks * bytes_per_block(cfg, 16, torch.float32),
        async_scheduling=async_scheduling,
    )  # fmt: skip
    assert totals["preemptions"] > 0
    assert got == expected["varied"]


def test_shared_prefix_through_the_prefix_cache(model_dir, prompts, expected):
    shared = prompts["shared"]
    common = next(i for i, column in enumerate(zip(*shared, strict=False)) if len(set(column)) > 1)
    assert common >= 200
    got, totals = _generate(model_dir, shared, max_num_batched_tokens=256)
    assert totals["prefix_cache_hit_tokens"] >= common // 16 * 16  # at least one whole reuse
    assert got == expected["shared"]
