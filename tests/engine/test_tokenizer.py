"""The tokenizer bulkrun loads without transformers' tokenizer classes gives exactly AutoTokenizer's
ids, texts, special tokens and chat prompts; a tokenizer with class-specific settings loads through
AutoTokenizer."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from bulkrun.engine.tokenizer import FastTokenizer, load_tokenizer

TEXTS = [
    "Hello world",
    "  leading spaces and\ttabs\n\nnewlines",
    "émojis 🤖 and 中文",
    "",
    "w3 w4 w5 </s> w6",
]
CHATS = [
    [{"role": "user", "content": "hi w3"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "w4 w5"}],
]
TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s>{% endfor %}"
    "{% if add_generation_prompt %}<s> assistant{% endif %}"
)


@pytest.fixture(scope="module")
def word_tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("word_tok")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, 40)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<pad>"
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["word", "default_model"])
def pair(request, word_tokenizer_dir):
    if request.param == "word":
        folder = word_tokenizer_dir
    else:
        from bulkrun.model_source import resolve_model

        folder = resolve_model(None)
    return load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))


def test_generic_tokenizers_load_without_transformers_classes(pair):
    ours, _ = pair
    assert isinstance(ours, FastTokenizer)


def test_ids_and_texts_equal_autotokenizers(pair):
    ours, ref = pair
    for special in (True, False):
        assert (
            ours(TEXTS, add_special_tokens=special)["input_ids"]
            == ref(TEXTS, add_special_tokens=special)["input_ids"]
        )
        for text in TEXTS:
            ids = ours(text, add_special_tokens=special)["input_ids"]
            assert ids == ref(text, add_special_tokens=special)["input_ids"]
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "eos_token", "chat_template"):
        assert getattr(ours, name) == getattr(ref, name), name


def test_chat_prompts_equal_autotokenizers(pair):
    ours, ref = pair
    for gen in (True, False):
        assert ours.apply_chat_template(
            CHATS, tokenize=False, add_generation_prompt=gen
        ) == ref.apply_chat_template(CHATS, tokenize=False, add_generation_prompt=gen)
        for chat in CHATS:
            want = ref.apply_chat_template(chat, tokenize=True, add_generation_prompt=gen, return_dict=False)
            assert ours.apply_chat_template(chat, add_generation_prompt=gen, return_dict=False) == list(want)


def test_class_specific_settings_load_through_autotokenizer(word_tokenizer_dir, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (word_tokenizer_dir / name).exists():
            (tmp_path / name).write_bytes((word_tokenizer_dir / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"add_bos_token": True}))
    assert not isinstance(load_tokenizer(tmp_path), FastTokenizer)
