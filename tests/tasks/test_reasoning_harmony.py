"""gpt-oss's harmony output: the analysis channel in `reasoning`, the final channel alone in `text`, a
generation cut before the final channel began stated in finish_reason; read from the token ids (the
markers are special tokens, which the engine's text leaves out). A job writes the columns, and a model
whose vocabulary has the markers is recognised from its directory."""

from __future__ import annotations

import pytest
from helpers.fake_engine import FakeEngine
from helpers.models import build_harmony_tokenizer, build_tokenizer, make_model_for_tokenizer
from helpers.rows import read_jsonl, write_jsonl

from bulkrun.cli import main
from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.tokenizer import load_tokenizer
from bulkrun.job.runner import run_job
from bulkrun.job.spec import build_spec
from bulkrun.tasks.reasoning import HARMONY_MARKERS, LENGTH_IN_REASONING, Harmony, Think, reasoning_format

PROMPT = "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant"  # as the chat template ends
ANALYSIS = "<|channel|>analysis<|message|>Add them: 4.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 4.<|return|>"


@pytest.fixture(scope="module")
def tokenizer():
    return build_harmony_tokenizer()


def _split(tokenizer, output: str, finish: str, prompt: str = PROMPT, text: str | None = None):
    """Split `output` as the engine hands it back: its token ids and its text without the markers."""
    ids = tokenizer.encode(output, add_special_tokens=False)
    if text is None:
        text = tokenizer.decode(ids, skip_special_tokens=True)
    return reasoning_format(tokenizer).split_one(tokenizer.encode(prompt, add_special_tokens=False), ids, text,
                                                 finish)  # fmt: skip


@pytest.mark.parametrize(
    ("output", "finish", "want"),
    [
        (ANALYSIS + FINAL, "stop", ("Add them: 4.", "It is 4.", "stop")),
        ("<|channel|>analysis<|message|>Add them", "length", ("Add them", "", LENGTH_IN_REASONING)),
        (ANALYSIS + "<|start|>assistant<|channel|>fin", "length", ("Add them: 4.", "", LENGTH_IN_REASONING)),
        (ANALYSIS + "<|start|>assistant<|channel|>final<|message|>", "length", ("Add them: 4.", "", "length")),
        (ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is", "length", ("Add them: 4.", "It is", "length")),
        ("<|channel|>final<|message|>4<|return|>", "stop", ("", "4", "stop")),  # no analysis at all
        # a tool call in the commentary channel (bulkrun runs no tools): not the answer, kept with the thoughts
        (ANALYSIS + '<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2}<|call|>',
         "stop", ('Add them: 4.\n{"a": 2}', "", "stop")),
        ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>" + FINAL,
         "stop", ("a\nb", "It is 4.", "stop")),
    ],
)  # fmt: skip
def test_split_harmony(tokenizer, output, finish, want):
    assert _split(tokenizer, output, finish) == want


def test_where_the_prompt_leaves_off(tokenizer):
    plain = "Just an answer."
    assert _split(tokenizer, plain, "length", prompt="2 + 2 =") == ("", plain, "length")  # no template
    prefilled = PROMPT + "<|channel|>analysis<|message|>"  # the prompt opened the thought
    assert _split(tokenizer, "Add.<|end|>" + FINAL, "stop", prompt=prefilled) == ("Add.", "It is 4.", "stop")
    assert _split(tokenizer, "Add", "length", prompt=prefilled) == ("Add", "", LENGTH_IN_REASONING)
    named = ANALYSIS.removeprefix("<|channel|>") + FINAL  # the prompt ended in <|channel|>
    assert _split(tokenizer, named, "stop", prompt=PROMPT + "<|channel|>") == (
        "Add them: 4.",
        "It is 4.",
        "stop",
    )


def test_a_stop_string_cut_is_kept(tokenizer):
    """The engine's text ends before the stop string; the tokens run on to the token that completed it."""
    output = "<|channel|>analysis<|message|>Add them. STOP here"
    assert _split(tokenizer, output, "stop", text="analysisAdd them. ") == ("Add them. ", "", "stop")
    output = ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is 4. STOP"
    assert _split(tokenizer, output, "stop", text="analysisAdd them: 4.assistantfinalIt is 4. ") == (
        "Add them: 4.", "It is 4. ", "stop")  # fmt: skip


def test_the_vocabulary_names_the_format(tokenizer):
    assert isinstance(reasoning_format(tokenizer), Harmony)
    think = build_tokenizer()
    think.add_tokens(["<think>", "</think>"])
    assert isinstance(reasoning_format(think), Think)
    assert reasoning_format(build_tokenizer()) is None  # <|channel|> and </think> are no single tokens


class ScriptedEngine(FakeEngine):
    """Answers each prompt with the harmony output its row's text names, as the engine would hand it
    back: the ids (the stop token included), the text without the markers (nor the stop token)."""

    SCRIPTS = {
        "done": (ANALYSIS + FINAL, "stop"),
        "cut": ("<|channel|>analysis<|message|>Still adding", "length"),
    }

    def _output(self, req):
        prompt = self.tokenizer.decode(req.prompt_token_ids)
        output, finish = next(v for k, v in self.SCRIPTS.items() if f"<|message|>{k}<|end|>" in prompt)
        ids = self.tokenizer.encode(output, add_special_tokens=False)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return RequestOutput(req.request_id, req.prompt_token_ids, ids, text, finish)


@pytest.fixture(scope="module")
def harmony_model(tmp_path_factory, tokenizer):
    return make_model_for_tokenizer(tmp_path_factory.mktemp("harmony"), tokenizer)


def test_a_job_writes_the_final_channel_as_text(tmp_path, harmony_model):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "done"}, {"id": "b", "text": "cut"}])
    spec = build_spec([("test", dict(task="generate", input=str(source), out=str(tmp_path / "out"),
                                     model=str(harmony_model), quiet=True))])  # fmt: skip
    run_job(spec, engine=ScriptedEngine(load_tokenizer(harmony_model)))  # the tokenizer as a run loads it
    rows = {row["id"]: row for row in read_jsonl(tmp_path / "out" / "results.jsonl")}
    assert (rows["a"]["reasoning"], rows["a"]["text"], rows["a"]["finish_reason"]) == ("Add them: 4.", "It is 4.",
                                                                                         "stop")  # fmt: skip
    assert (rows["b"]["reasoning"], rows["b"]["text"], rows["b"]["finish_reason"]) == (
        "Still adding", "", LENGTH_IN_REASONING)  # fmt: skip


def test_the_cli_gives_a_harmony_model_a_reasoning_column(tmp_path, harmony_model):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "What is 2 + 2?"}])
    out = tmp_path / "out"
    code = main(["generate", str(source), "--model", str(harmony_model), "--out", str(out), "--max-tokens", "12",
                 "--dtype", "float32", "--kv-cache-bytes", "16MiB", "--quiet"])  # fmt: skip
    assert code == 0
    (row,) = read_jsonl(out / "results.jsonl")
    assert {"reasoning", "text", "finish_reason"} <= row.keys() and row["generated_tokens"] <= 12
    assert row["prompt_tokens"] == len(load_tokenizer(harmony_model).encode(PROMPT, add_special_tokens=False))
    assert not any(m in row["text"] + row["reasoning"] for m in HARMONY_MARKERS)
