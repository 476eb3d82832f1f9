"""End to end on the default model: decoding under the grammar mask gives 100% valid outputs.

A plain decoding loop over transformers' model (fp32, KV cache, one forward per row and step) stands in
for the engine, which takes the same three calls per step in phase 2: MaskFiller.fill for all
constrained rows at once, apply_token_bitmask on their logits, and accept of the chosen tokens. Every
output is then validated by check_output (the jsonschema package), greedy and sampled alike.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.constraints import PROMPTS, specs

from bulkrun.engine.structured_output.bitmask import apply_token_bitmask
from bulkrun.engine.structured_output.grammar import GrammarCache, GrammarTokenizer, MaskFiller, new_bitmask
from bulkrun.engine.structured_output.output import check_output

pytestmark = pytest.mark.slow
MAX_TOKENS = 160


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bulkrun.model_source import resolve_model

    model_dir = resolve_model(None)
    hf = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    return hf, model, GrammarCache(GrammarTokenizer.from_model_dir(model_dir, vocab, [hf.eos_token_id]))


@torch.no_grad()
def decode_all(setup, temperature: float, seed: int = 0) -> dict[str, tuple[str, str]]:
    """Every spec's row decoded in lockstep -> {name: (text, finish_reason)}."""
    hf, model, cache = setup
    rows = specs()
    names = list(rows)
    matchers = [cache.matcher(rows[n]) for n in names]
    prompts = [
        hf.apply_chat_template([{"role": "user", "content": PROMPTS[n]}], add_generation_prompt=True, tokenize=True, return_dict=False)
        for n in names
    ]  # fmt: skip
    past, nxt = [None] * len(names), [torch.tensor([list(p)]) for p in prompts]
    out, finish = [[] for _ in names], [None] * len(names)
    gen = torch.Generator().manual_seed(seed)
    filler, bitmask = MaskFiller(), new_bitmask(len(names), cache.tokenizer)
    for _ in range(MAX_TOKENS):
        live = [i for i in range(len(names)) if finish[i] is None]
        if not live:
            break
        logits = []
        for i in live:
            o = model(input_ids=nxt[i], past_key_values=past[i], use_cache=True)
            past[i] = o.past_key_values
            logits.append(o.logits[0, -1].float())
        logits = torch.stack(logits)
        filler.fill([matchers[i] for i in live], bitmask)
        apply_token_bitmask(logits, torch.from_numpy(bitmask))
        if temperature == 0:
            tokens = logits.argmax(-1).tolist()
        else:
            tokens = (
                torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)
                .flatten()
                .tolist()
            )
        for i, t in zip(live, tokens, strict=True):
            if t == hf.eos_token_id:
                finish[i] = "stop"
                continue
            assert matchers[i].accept(t), matchers[i].error
            out[i].append(t)
            nxt[i] = torch.tensor([[t]])
    return {n: (hf.decode(out[i]), finish[i] or "length") for i, n in enumerate(names)}


def assert_all_valid(results: dict[str, tuple[str, str]]) -> None:
    rows = specs()
    for name, (text, finish) in results.items():
        check = check_output(rows[name], text, finish)
        assert check.ok, (name, text, check.message)
        assert finish == "stop", (name, text)


def test_greedy_outputs_are_all_valid(setup):
    results = decode_all(setup, temperature=0)
    assert_all_valid(results)
    assert json.loads(results["enums"][0])["color"] in ("red", "green", "blue")


@pytest.mark.parametrize("seed", [1, 2])
def test_sampled_outputs_are_all_valid(setup, seed):
    assert_all_valid(decode_all(setup, temperature=1.0, seed=seed))
