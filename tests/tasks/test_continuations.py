"""Label continuations are tokenized exactly as they would follow the prompt."""

from __future__ import annotations

from helpers.tasks import chat_prompt_ids

from bulkrun.tasks.continuations import ContinuationTokenizer, label_text

LABELS = ("billing", "bug", "shipping", "account access", "Feature request", "données")


def _encode(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_chat_prompt_continuations_equal_joint_tokenization(tokenizer):
    conts = ContinuationTokenizer(tokenizer, LABELS)
    for text in ["My card was charged twice.", "L'application plante au démarrage", "x" * 300]:
        prompt_ids = chat_prompt_ids(tokenizer, text)
        prompt_text = tokenizer.decode(prompt_ids)
        for label, cont in zip(LABELS, conts(prompt_ids), strict=True):
            assert prompt_ids + cont == _encode(tokenizer, prompt_text + label)
    assert conts.fallbacks == 0
    assert any(len(c) > 1 for c in conts(prompt_ids))  # multi-token labels are in the set


def test_raw_prompt_gets_a_space_before_the_label(tokenizer):
    prompt = "Classify the ticket.\nText: refund please\nLabel:"
    prompt_ids = _encode(tokenizer, prompt)
    conts = ContinuationTokenizer(tokenizer, LABELS)(prompt_ids)
    for label, cont in zip(LABELS, conts, strict=True):
        assert prompt_ids + cont == _encode(tokenizer, prompt + " " + label)
    assert label_text("Label:", "bug") == " bug" and label_text("assistant\n", "bug") == "bug"


def test_boundary_merge_falls_back_to_separate_tokens_and_is_counted(tokenizer):
    # A prompt ending in a space: the joint text merges " billing" into one token, so the prompt's
    # own trailing-space token is not a prefix of the joint tokenization.
    prompt_ids = _encode(tokenizer, "Text: refund please\nLabel: ")
    conts = ContinuationTokenizer(tokenizer, ("billing", "bug"))
    result = conts(prompt_ids)
    assert result == [_encode(tokenizer, "billing"), _encode(tokenizer, "bug")]
    assert conts.fallbacks == 1
    conts(prompt_ids)  # cached, and still counted per item
    assert conts.fallbacks == 2


def test_same_tail_is_tokenized_once(tokenizer):
    calls = []

    class CountingTokenizer:
        def __call__(self, text, **kw):
            calls.append(text)
            return tokenizer(text, **kw)

        def decode(self, ids, **kw):
            return tokenizer.decode(ids, **kw)

    conts = ContinuationTokenizer(CountingTokenizer(), ("billing", "bug"))
    first = conts(chat_prompt_ids(tokenizer, "one ticket"))
    n = len(calls)
    assert conts(chat_prompt_ids(tokenizer, "another, longer ticket text")) == first
    assert len(calls) == n


def _ticket_texts():
    import json
    from importlib.resources import files

    lines = files("bulkrun.data").joinpath("tickets.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines]


def test_exact_whenever_the_full_joint_tokenization_extends_the_prompt(tokenizer):
    """Over raw prompts ending in all kinds of characters (the tickets cut at odd places): the tail
    method agrees with tokenizing the whole prompt + label, and falls back exactly when it must."""
    labels = ("billing", "bug", "shipping", "account access")
    checked = fell_back = 0
    for number, text in enumerate(_ticket_texts()):
        prompt = text[: 10 + (number * 7) % max(1, len(text) - 10)]
        prompt_ids = _encode(tokenizer, prompt)
        conts = ContinuationTokenizer(tokenizer, labels)
        result = conts(prompt_ids)
        joint = [_encode(tokenizer, prompt + label_text(prompt, label)) for label in labels]
        must_fall_back = any(ids[: len(prompt_ids)] != prompt_ids for ids in joint)
        assert conts.fallbacks == must_fall_back, prompt
        if not must_fall_back:
            assert [prompt_ids + c for c in result] == joint
        checked += 1
        fell_back += must_fall_back
    assert checked == 100 and fell_back < checked
