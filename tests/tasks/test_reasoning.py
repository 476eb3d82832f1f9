"""Reasoning output: a thinking model's <think> block in a `reasoning` column, `text` holding only the
answer, a thought cut by max_tokens stated in finish_reason; --chat-template-kwargs reaching the
chat template."""

from __future__ import annotations

import pytest
from helpers.models import make_model_for_tokenizer
from helpers.rows import read_jsonl, write_jsonl

from bulkrun.cli import main
from bulkrun.tasks.reasoning import LENGTH_IN_REASONING, split_think

ENGINE_FLAGS = ["--dtype", "float32", "--kv-cache-bytes", "16MiB", "--max-num-seqs", "4",
                "--max-num-batched-tokens", "256", "--quiet"]  # fmt: skip
# Qwen3's shape: the thought is opened in the prompt unless enable_thinking is false, which closes it
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
)


@pytest.mark.parametrize(
    ("text", "finish", "opened", "want"),
    [
        ("<think>\nplan it\n</think>\n\nThe answer.", "stop", False, ("plan it", "The answer.", "stop")),
        ("plan it</think>42", "stop", True, ("plan it", "42", "stop")),  # opened by the template
        ("<think>still going", "length", False, ("still going", "", LENGTH_IN_REASONING)),
        ("still going", "length", True, ("still going", "", LENGTH_IN_REASONING)),
        ("no thought at all", "length", False, ("", "no thought at all", "length")),
        ("a</think>b</think>c", "stop", False, ("a", "b</think>c", "stop")),  # the first close ends it
    ],
)
def test_split_think(text, finish, opened, want):
    assert split_think(text, finish, opened) == want


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    from helpers.models import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = TEMPLATE
    return make_model_for_tokenizer(tmp_path_factory.mktemp("thinking"), tokenizer)


def _generate(tmp_path, model, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = tmp_path / "in.jsonl"
    write_jsonl(source, [{"id": "a", "text": "What is 2 + 2?"}, {"id": "b", "text": "Name a colour."}])
    out = tmp_path / "out"
    code = main(["generate", str(source), "--model", str(model), "--out", str(out), "--id-field", "id",
                 "--max-tokens", "5", *ENGINE_FLAGS, *extra])  # fmt: skip
    assert code == 0
    return read_jsonl(out / "results.jsonl")


def test_a_thought_cut_by_max_tokens_is_no_answer(tmp_path, thinking_model):
    rows = _generate(tmp_path, thinking_model)
    assert all("</think>" not in row["reasoning"] for row in rows)  # (seeded: no close among 5 tokens)
    for row in rows:  # the thought the template opened never closed: no answer, and it says so
        assert row["text"] == "" and row["finish_reason"] == LENGTH_IN_REASONING
        assert row["generated_tokens"] == 5


def test_enable_thinking_false_reaches_the_template(tmp_path, thinking_model):
    thinking = _generate(tmp_path / "on", thinking_model)
    plain = _generate(
        tmp_path / "off", thinking_model, "--chat-template-kwargs", '{"enable_thinking": false}'
    )
    # the closed empty thought is in the prompt: longer prompts, and the output is all answer
    assert all(p["prompt_tokens"] > t["prompt_tokens"] for p, t in zip(plain, thinking, strict=True))
    assert all(row["reasoning"] == "" and row["finish_reason"] == "length" for row in plain)


def test_bad_chat_template_kwargs_stop_before_work(tmp_path, thinking_model, capsys):
    source = tmp_path / "in.jsonl"
    write_jsonl(source, [{"id": "a", "text": "hi"}])
    code = main(["generate", str(source), "--model", str(thinking_model), "--out", str(tmp_path / "o"),
                 "--chat-template-kwargs", "{enable_thinking: no}", *ENGINE_FLAGS])  # fmt: skip
    assert code != 0 and "chat_template_kwargs" in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.jsonl").exists()
