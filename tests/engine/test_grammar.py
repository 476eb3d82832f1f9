"""Constraint specs, compiled-grammar cache, matcher state and batched mask filling, on the default
model's real tokenizer (no weights needed)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from bulkrun.engine.structured_output import grammar
from bulkrun.engine.structured_output.grammar import (
    ConstraintSpec,
    GrammarCache,
    GrammarError,
    GrammarTokenizer,
    MaskFiller,
    new_bitmask,
)

TICKET = json.load(open(__file__.rsplit("/", 3)[0] + "/jobs/schemas/support-ticket.json"))
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    from bulkrun.model_source import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None))


@pytest.fixture(scope="module")
def tokenizer(hf_tokenizer) -> GrammarTokenizer:
    return GrammarTokenizer.from_hf(hf_tokenizer, len(hf_tokenizer), [hf_tokenizer.eos_token_id])


@pytest.fixture(scope="module")
def cache(tokenizer) -> GrammarCache:
    return GrammarCache(tokenizer)


def allowed(bitmask_row: np.ndarray, vocab: int) -> set[int]:
    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")[:vocab]
    return set(np.flatnonzero(bits).tolist())


def feed(matcher, hf_tokenizer, text: str) -> bool:
    return all(matcher.accept(t) for t in hf_tokenizer.encode(text))


def test_equal_schemas_are_one_spec_however_they_are_spelled():
    a = ConstraintSpec.json_schema(
        {"type": "object", "required": ["x"], "properties": {"x": {"type": "string"}}}
    )
    b = ConstraintSpec.json_schema(
        '{"type":"object",  "required":["x"],\n "properties":{"x":{"type":"string"}}}'
    )
    assert a == b and hash(a) == hash(b)
    assert ConstraintSpec.choice(["a", "b", "a"]).choices == ["a", "b"]


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: ConstraintSpec.json_schema("{not json"), "not valid JSON"),
        (lambda: ConstraintSpec.json_schema([1, 2]), "must be an object"),
        (lambda: ConstraintSpec.json_schema({"type": "object", "properties": {"x": {"type": "strin"}}}),
         "/properties/x/type"),
        (lambda: ConstraintSpec.regex(""), "empty"),
        (lambda: ConstraintSpec.choice([]), "non-empty"),
    ],
)  # fmt: skip
def test_malformed_constraints_are_named(make, words):
    with pytest.raises(GrammarError, match=words):
        make()


def test_compiles_are_cached_by_spec_and_tokenizer(tokenizer, hf_tokenizer):
    cache = GrammarCache(tokenizer)
    first = cache.compile(ConstraintSpec.json_schema(TICKET))
    again = cache.compile(ConstraintSpec.json_schema(json.dumps(TICKET, indent=2)))
    assert again is first and (cache.hits, cache.misses) == (1, 1)
    other = GrammarTokenizer.from_hf(hf_tokenizer, len(hf_tokenizer) + 64, [hf_tokenizer.eos_token_id])
    assert other.fingerprint != tokenizer.fingerprint


def test_a_constraint_that_cannot_compile_fails_once_and_is_remembered(tokenizer):
    cache = GrammarCache(tokenizer)
    bad = ConstraintSpec.regex("[a-z")
    for _ in range(2):
        with pytest.raises(GrammarError, match="regex constraint cannot be compiled"):
            cache.compile(bad)
    assert (cache.hits, cache.misses) == (1, 1)


def test_unsupported_schema_feature_is_an_error_not_ignored(cache):
    # llguidance is not lenient: a keyword it cannot enforce stops the compile instead of being dropped
    with pytest.raises(GrammarError, match="json_schema constraint cannot be compiled"):
        cache.compile(
            ConstraintSpec.json_schema({"type": "object", "patternProperties": {"^a": {}}, "not": {}})
        )


def test_compile_past_the_time_limit_is_a_clear_error(tokenizer, monkeypatch):
    # a compile that cannot finish until the test lets it: past any limit, whatever the machine's speed
    release = threading.Event()
    calls = []

    def blocked_compile(spec, tok):
        calls.append(spec)
        release.wait()
        raise GrammarError("released")

    monkeypatch.setattr(grammar, "_compile", blocked_compile)
    cache = GrammarCache(tokenizer, time_limit_s=0.05)
    slow = ConstraintSpec.regex("a+")
    try:
        for _ in range(2):  # the timeout is remembered: the slow compile is not started again
            with pytest.raises(GrammarError, match=r"regex constraint took over 0.05s to compile"):
                cache.compile(slow)
    finally:
        release.set()
    assert cache.misses == 1 and calls == [slow]


def test_matcher_follows_a_valid_record_and_rejects_a_wrong_token(cache, hf_tokenizer):
    m = cache.matcher(ConstraintSpec.json_schema(PERSON))
    assert feed(m, hf_tokenizer, '{"name":"Ada",')
    assert not m.is_accepting
    assert not m.allows(hf_tokenizer.encode("}")[0])  # "age" is required
    assert feed(m, hf_tokenizer, '"age":36}')
    assert m.is_accepting and m.is_finished and m.error is None
    assert m.allows(hf_tokenizer.eos_token_id)


def test_whitespace_between_tokens_is_not_allowed_by_default(cache, hf_tokenizer):
    m = cache.matcher(ConstraintSpec.json_schema(PERSON))
    assert not m.allows(hf_tokenizer.encode(" ")[0]) and not m.allows(hf_tokenizer.encode("\n")[0])
    assert feed(m, hf_tokenizer, "{")
    assert not m.allows(hf_tokenizer.encode(" ")[0])


def test_rollback_undoes_the_last_tokens(cache, hf_tokenizer):
    m = cache.matcher(ConstraintSpec.choice(["positive", "negative"]))
    tokens = hf_tokenizer.encode("positive")
    assert feed(m, hf_tokenizer, "positive") and m.is_accepting
    m.rollback(len(tokens))
    assert m.num_accepted == 0 and not m.is_accepting
    assert feed(m, hf_tokenizer, "negative") and m.is_accepting
    with pytest.raises(ValueError, match="cannot roll back"):
        m.rollback(len(tokens) + 1)


def test_a_broken_token_puts_the_matcher_in_error(cache, hf_tokenizer):
    m = cache.matcher(ConstraintSpec.regex(r"[0-9]{3}"))
    assert not m.accept(hf_tokenizer.encode("abc")[0])
    assert m.error and m.is_finished


def test_each_request_starts_from_its_own_state(cache, hf_tokenizer):
    spec = ConstraintSpec.regex(r"(yes|no)")
    a, b = cache.matcher(spec), cache.matcher(spec)
    assert feed(a, hf_tokenizer, "yes")
    assert b.num_accepted == 0 and not b.is_accepting and feed(b, hf_tokenizer, "no")


@pytest.mark.parametrize(
    "fill", [MaskFiller.fill, MaskFiller.fill_here], ids=["thread-pool", "calling-thread"]
)
def test_batched_fill_equals_one_row_at_a_time(cache, tokenizer, hf_tokenizer, fill):
    specs = [ConstraintSpec.json_schema(TICKET), ConstraintSpec.json_schema(PERSON),
             ConstraintSpec.regex(r"[A-Z][a-z]+"), ConstraintSpec.choice(["red", "green"]), ConstraintSpec.json_object()]  # fmt: skip
    prefixes = ['{"subject":"Refund', '{"name":"A","age":4', "Hel", "", "{"]
    matchers = [cache.matcher(s) for s in specs]
    for m, p in zip(matchers, prefixes, strict=True):
        assert feed(m, hf_tokenizer, p)
    batch = new_bitmask(len(matchers) + 2, tokenizer)  # spare rows stay untouched
    fill(MaskFiller(), matchers, batch)
    vocab = tokenizer.vocab_size
    for i, m in enumerate(matchers):
        single = np.frombuffer(m.ll.compute_bitmask(), dtype=np.int32)
        assert allowed(batch[i], vocab) == allowed(single, vocab)
        assert 0 < len(allowed(batch[i], vocab)) < vocab
    assert (batch[len(matchers) :] == -1).all()


def test_a_finished_grammar_allows_only_eos(cache, tokenizer, hf_tokenizer):
    m = cache.matcher(ConstraintSpec.choice(["red", "green"]))
    assert feed(m, hf_tokenizer, "green") and m.is_finished
    mask = new_bitmask(1, tokenizer)
    MaskFiller().fill([m], mask)
    assert allowed(mask[0], tokenizer.vocab_size) == {hf_tokenizer.eos_token_id}


def test_parallel_accept_advances_every_matcher(cache, hf_tokenizer):
    spec = ConstraintSpec.regex(r"[0-9]+")
    matchers = [cache.matcher(spec) for _ in range(3)]
    digit, letter = hf_tokenizer.encode("7")[0], hf_tokenizer.encode("x")[0]
    assert MaskFiller().accept(matchers, [digit, letter, digit]) == [True, False, True]
    assert [m.num_accepted for m in matchers] == [1, 0, 1]
    assert matchers[1].error and matchers[0].is_accepting


def test_fill_refuses_a_wrong_buffer(cache, tokenizer):
    m = cache.matcher(ConstraintSpec.json_object())
    with pytest.raises(ValueError, match="int32"):
        MaskFiller().fill([m], np.zeros((1, tokenizer.mask_words), dtype=np.int64))
    with pytest.raises(ValueError, match="1 matchers for a bitmask of 0 rows"):
        MaskFiller().fill([m], new_bitmask(0, tokenizer))
    with pytest.raises(ValueError, match="1 matchers for a bitmask of 0 rows"):
        MaskFiller().fill_here([m], new_bitmask(0, tokenizer))


def test_objects_are_closed_unless_the_schema_opens_them():
    from bulkrun.engine.structured_output.grammar import closed_objects

    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "string"}}},  # a key named so
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "data": {"enum": [{"properties": {}}]},  # data, not a schema
        },
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False
    assert closed["properties"]["open"]["additionalProperties"] is True
    assert closed["properties"]["data"] == {"enum": [{"properties": {}}]}
    assert "additionalProperties" not in schema  # the schema as written is left alone (validation)
