"""Classification by label scoring: every label is scored as a continuation of the item's prompt.

The prompt puts a long instruction shared by every item FIRST (labels, their descriptions, a few
examples) so that it is a common prefix and the engine's prefix cache computes it once. The item's
text follows. The engine computes the prompt once per item and scores each label's tokens under it;
a label's score is the sum of its token log-probabilities (or the mean, `normalize="mean"`), and the
raw label probabilities are a softmax over those scores.

Calibration (`calibrate = "content-free"`, the default): before any item, the job layer scores the
labels after a few content-free inputs put in the item's place (`content_free_prompts()`, then
`set_content_free()`); their label distribution is the bias the prompt carries whatever the text
says, and every item's probabilities are divided by it (bulkrun.tasks.calibration). The label is
the calibrated argmax; the raw one stays in the record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.core.params import EngineRequest
from bulkrun.tasks.base import Item, RowError, Task, TaskContext, prompt_text, template_fields
from bulkrun.tasks.calibration import (
    CALIBRATE_MODES,
    DEFAULT_CONTENT_FREE_INPUTS,
    CalibrationError,
    Calibrator,
)
from bulkrun.tasks.continuations import ContinuationTokenizer, on_new_line, scoring_request
from bulkrun.tasks.labels import LabelError, LabelSet, label_set_from_options

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


# Stands for the item's text while a content-free prompt is rendered: the template and the
# instruction are filled exactly as for an item, then this is replaced by the content-free input.
_PLACEHOLDER = "\x00content-free\x00"


def content_free_inputs_from(value) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_CONTENT_FREE_INPUTS
    if isinstance(value, str) or not all(isinstance(v, str) for v in value) or not value:
        raise ValueError('content_free_inputs must be a non-empty list of strings, e.g. ["N/A", ""]')
    return tuple(value)


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
        "calibrate": "content-free",
        "content_free_inputs": None,  # default: calibration.DEFAULT_CONTENT_FREE_INPUTS
    }

    def __init__(
        self,
        labels: LabelSet,
        *,
        instruction: str | None = None,
        examples: Sequence[Mapping] = (),
        normalize: str = "sum",
        answer_prefix: str = "Label:",
        calibrate: str = "content-free",
        content_free_inputs: Sequence[str] = DEFAULT_CONTENT_FREE_INPUTS,
    ):
        if normalize not in NORMALIZE_MODES:
            raise ValueError(f"normalize must be one of {', '.join(NORMALIZE_MODES)}, got {normalize!r}")
        if calibrate not in CALIBRATE_MODES:
            raise ValueError(f"calibrate must be one of {', '.join(CALIBRATE_MODES)}, got {calibrate!r}")
        self.calibrate = calibrate
        self.content_free_inputs = tuple(content_free_inputs)
        # Set by set_content_free() before any result (content-free), or identity (none).
        self.calibrator: Calibrator | None = (
            None if calibrate == "content-free" else Calibrator.identity(len(labels))
        )
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
            calibrate=options.get("calibrate") or "content-free",
            content_free_inputs=content_free_inputs_from(options.get("content_free_inputs")),
        )

    def bind(self, ctx: TaskContext) -> None:
        super().bind(ctx)
        self.continuations = ContinuationTokenizer(ctx.tokenizer, self.labels.names)
        if self.answer_prefix:
            self.prefix = ContinuationTokenizer(ctx.tokenizer, (self.answer_prefix,), join=on_new_line)

    def render(self, item: Item) -> str:
        text = prompt_text(item.fields, self.ctx.prompt_template, self.ctx.text_field)
        return f"{self.instruction}\n\nText: {text}"

    def content_free_prompts(self) -> list[str]:
        """The prompts to score before any item (none without calibration): each content-free
        input in the place of every field the item's text comes from."""
        if self.calibrate != "content-free":
            return []
        template = self.ctx.prompt_template
        names = template_fields(template) if template is not None else [self.ctx.text_field]
        # The placeholder is not blank, so the empty content-free input passes the empty-text check.
        rendered = self.render(Item(-1, "content-free", {name: _PLACEHOLDER for name in names}))
        return [rendered.replace(_PLACEHOLDER, text) for text in self.content_free_inputs]

    def set_content_free(self, outputs: Sequence[RequestOutput]) -> None:
        """The prior, from the outputs of content_free_prompts()' requests (in that order)."""
        scores = []
        for text, output in zip(self.content_free_inputs, outputs, strict=True):
            if output.finish_reason == "error" or output.continuation_logprobs is None:
                raise CalibrationError(f"content-free input {text!r} could not be scored: {output.error}")
            scores.append([self._score(lps) for lps in output.continuation_logprobs])
        self.calibrator = Calibrator.from_content_free(scores)

    def requests(self, item: Item, prompt_ids: list[int]) -> list[EngineRequest]:
        prompt_ids = self.answer_start(prompt_ids)
        continuations = self.continuations(prompt_ids)
        return [scoring_request("score", prompt_ids, continuations, self.ctx.max_model_len, "a label")]

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
        if self.calibrator is None:
            raise RuntimeError("calibrated classification needs set_content_free() before any result")
        scores = [self._score(lps) for lps in output.continuation_logprobs]
        try:
            scored = self.calibrator(scores)
        except CalibrationError as exc:
            raise RowError("engine_error", f"unusable label scores: {exc}") from None
        names = self.labels.names

        def by_label(values):
            return dict(zip(names, values, strict=True))

        columns = {
            "label": names[scored.best],  # ties: the first label listed
            "probability": scored.calibrated[scored.best],
            "label_probs": by_label(scored.calibrated),
            "label_scores": by_label(scores),
        }
        if self.calibrate == "content-free":
            columns |= {
                "raw_label": names[scored.best_raw],
                "raw_probability": scored.raw[scored.best_raw],
                "raw_label_probs": by_label(scored.raw),
                "label_prior": by_label(self.calibrator.prior),
            }
        return columns

    def _score(self, logprobs: Sequence[float]) -> float:
        total = float(sum(logprobs))
        return total / len(logprobs) if self.normalize == "mean" else total

    def summarize(self, results) -> dict | None:
        """One pass over the result records (a list or a stream)."""
        counts, raw_counts, prior = Counter(), Counter(), None
        for record in results:
            if record.get("label") is not None:
                counts[record["label"]] += 1
                raw_counts[record.get("raw_label")] += 1
                prior = prior or record.get("label_prior")
        summary = {"kind": "classify", "items": sum(counts.values())}
        summary["label_counts"] = {name: counts.get(name, 0) for name in self.labels}
        summary["calibration"] = self.calibration_summary(prior)
        if self.calibrate == "content-free":
            summary["raw_label_counts"] = {name: raw_counts.get(name, 0) for name in self.labels}
        fallbacks = sum(t.fallbacks for t in (self.continuations, self.prefix) if t is not None)
        if fallbacks:
            summary["label_tokenization_fallbacks"] = fallbacks
        return summary

    def calibration_summary(self, prior: Mapping | None) -> dict:
        """What metrics.json says about calibration; the prior as the records carry it (so that
        `bulkrun export` reports it without scoring anything)."""
        if self.calibrate != "content-free":
            return {"mode": "none"}
        return {"mode": "content-free", "content_free_inputs": list(self.content_free_inputs),
                "prior": dict(prior) if prior else None}  # fmt: skip

    def metrics_need_results(self) -> bool:
        return True


def _or_default(value, default):
    return default if value is None else value
