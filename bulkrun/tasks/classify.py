"""Classification by label scoring: every label is scored as a continuation of the item's prompt.

The prompt puts a long instruction shared by every item FIRST (labels, their descriptions, a few
examples) so that it is a common prefix and the engine's prefix cache computes it once. The item's
text follows. The engine computes the prompt once per item and scores each label's tokens under it;
a label's score is the sum of its token log-probabilities (or the mean, `normalize="mean"`), and the
label probabilities are a softmax over those scores.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from bulkrun.engine.outputs import RequestOutput
from bulkrun.engine.params import EngineRequest, SamplingParams
from bulkrun.tasks.base import Item, RowError, Task, TaskContext, prompt_text
from bulkrun.tasks.continuations import ContinuationTokenizer, on_new_line
from bulkrun.tasks.labels import LabelError, LabelSet, label_set_from_options
from bulkrun.tasks.metrics import metrics_lines

DEFAULT_INSTRUCTION = "Classify the text into exactly one of the labels below. Answer with the label only."
NORMALIZE_MODES = ("sum", "mean")


def build_instruction(labels: LabelSet, instruction: str | None, examples: Sequence[Mapping]) -> str:
    """The shared part of every prompt: instruction, labels (with descriptions), few-shot examples."""
    lines = [instruction or DEFAULT_INSTRUCTION, "", "Labels:"]
    for name in labels:
        description = labels.description(name)
        lines.append(f"- {name}: {description}" if description else f"- {name}")
    if examples:
        lines += ["", "Examples:"]
        for number, example in enumerate(examples, start=1):
            text, label = _example_fields(example, labels, number)
            lines += ["", f"Text: {text}", f"Label: {label}"]
    return "\n".join(lines)


def _example_fields(example: Mapping, labels: LabelSet, number: int) -> tuple[str, str]:
    text, label = example.get("text"), example.get("label")
    if not isinstance(text, str) or not isinstance(label, str):
        raise LabelError(f"example {number} needs string 'text' and 'label' fields")
    canonical = labels.find(label)
    if canonical is None:
        raise LabelError(f"example {number} has label {label!r}, which is not one of the labels")
    return " ".join(text.split()), canonical


def softmax(scores: Sequence[float]) -> list[float]:
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


class ClassifyTask(Task):
    name = "classify"
    # Spec keys / CLI flags of this task, with their defaults (see labels.label_set_from_options).
    options = {
        "labels": None,
        "labels_file": None,
        "label_descriptions": None,
        "instruction": None,
        "examples": None,
        "normalize": "sum",
        "answer_prefix": "Label:",
    }

    def __init__(
        self,
        labels: LabelSet,
        *,
        instruction: str | None = None,
        examples: Sequence[Mapping] = (),
        normalize: str = "sum",
        answer_prefix: str = "Label:",
    ):
        if normalize not in NORMALIZE_MODES:
            raise ValueError(f"normalize must be one of {', '.join(NORMALIZE_MODES)}, got {normalize!r}")
        self.labels = labels
        self.normalize = normalize
        self.instruction = build_instruction(labels, instruction, examples)
        self.answer_prefix = answer_prefix.strip()
        self.continuations: ContinuationTokenizer | None = None
        self.prefix: ContinuationTokenizer | None = None

    @classmethod
    def from_options(cls, options: dict) -> ClassifyTask:
        return cls(
            label_set_from_options(options),
            instruction=options.get("instruction"),
            examples=options.get("examples") or (),
            normalize=options.get("normalize") or "sum",
            answer_prefix=_or_default(options.get("answer_prefix", None), "Label:"),
        )

    def bind(self, ctx: TaskContext) -> None:
        super().bind(ctx)
        self.continuations = ContinuationTokenizer(ctx.tokenizer, self.labels.names)
        if self.answer_prefix:
            self.prefix = ContinuationTokenizer(ctx.tokenizer, (self.answer_prefix,), join=on_new_line)

    def render(self, item: Item) -> str:
        text = prompt_text(item.fields, self.ctx.prompt_template, self.ctx.text_field)
        return f"{self.instruction}\n\nText: {text}"

    def requests(self, item: Item, prompt_ids: list[int]) -> list[EngineRequest]:
        prompt_ids = self.answer_start(prompt_ids)
        continuations = self.continuations(prompt_ids)
        longest = len(prompt_ids) + max(len(c) for c in continuations)
        if longest > self.ctx.max_model_len:
            raise RowError(
                "prompt_too_long",
                f"prompt of {len(prompt_ids)} tokens plus a label exceeds the model's "
                f"context of {self.ctx.max_model_len} tokens",
            )
        params = SamplingParams(max_tokens=0)
        return [EngineRequest("score", prompt_ids, params, continuations=continuations)]

    def answer_start(self, prompt_ids: list[int]) -> list[int]:
        """The prompt with the answer begun (`Label:`, after the chat template's assistant header):
        each label then follows as ` label`, its ordinary in-text tokens. Right after the header a
        label would be tokenized as at the start of a text (`billing` -> `b` `illing`), whose
        first piece carries the probability of every word starting with it."""
        if self.prefix is None:
            return list(prompt_ids)
        return list(prompt_ids) + self.prefix(prompt_ids)[0]

    def result(self, item: Item, outputs: list[RequestOutput]) -> dict:
        return self.label_columns(outputs[0])

    def label_columns(self, output: RequestOutput) -> dict:
        if output.finish_reason == "error" or output.continuation_logprobs is None:
            raise RowError("engine_error", output.error or "the engine returned no label scores")
        scores = [self._score(lps) for lps in output.continuation_logprobs]
        probs = softmax(scores)
        best = max(range(len(scores)), key=scores.__getitem__)  # ties: the first label listed
        names = self.labels.names
        return {
            "label": names[best],
            "probability": probs[best],
            "label_probs": dict(zip(names, probs, strict=True)),
            "label_scores": dict(zip(names, scores, strict=True)),
        }

    def _score(self, logprobs: Sequence[float]) -> float:
        total = float(sum(logprobs))
        return total / len(logprobs) if self.normalize == "mean" else total

    def summarize(self, results) -> dict | None:
        """One pass over the result records (a list or a stream)."""
        counts = Counter(r["label"] for r in results if r.get("label") is not None)
        summary = {"kind": "classify", "items": sum(counts.values())}
        summary["label_counts"] = {name: counts.get(name, 0) for name in self.labels}
        fallbacks = sum(t.fallbacks for t in (self.continuations, self.prefix) if t is not None)
        if fallbacks:
            summary["label_tokenization_fallbacks"] = fallbacks
        return summary

    def metrics_need_results(self) -> bool:
        return True

    @staticmethod
    def summary_lines(summary: Mapping) -> list[str]:
        return metrics_lines(summary)


def _or_default(value, default):
    return default if value is None else value
