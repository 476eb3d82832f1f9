"""Eval suites: rows carry an expected answer; each result says whether the model got it right.

Three kinds of suite, chosen by the options:
- multiple choice (`choices_field`): every row brings its own choices, scored by log-likelihood as
  lm-evaluation-harness does (bulkrun.tasks.multiple_choice); metrics are acc and acc_norm;
- classify-style (labels): the answer is the best-scoring label (ClassifyTask's scoring, calibrated
  by default); metrics are accuracy (and the uncalibrated raw_accuracy), per-label
  precision/recall/F1 and a confusion matrix;
- generation: the model generates; the answer is the text, or what `answer_regex` extracts from it,
  compared exactly or after normalising whitespace and case (`match = "normalized"`).
"""

from __future__ import annotations

import re
from dataclasses import replace

from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.core.params import EngineRequest
from bulkrun.tasks.base import (
    Item,
    RowError,
    Task,
    TaskContext,
    generation_columns,
    prompt_text,
    sample_seed,
)
from bulkrun.tasks.chat import row_messages
from bulkrun.tasks.classify import ClassifyTask
from bulkrun.tasks.constraints import has_json_column, output_columns, row_constraint
from bulkrun.tasks.metrics import (
    answers_match,
    classification_metrics,
    extract_answer,
    generation_metrics,
)
from bulkrun.tasks.multiple_choice import TARGET_DELIMITER, MultipleChoice, multiple_choice_metrics
from bulkrun.tasks.sweep import SWEEP_KEYS

MATCH_MODES = ("exact", "normalized")
LABEL_ONLY = ("label_descriptions", "instruction", "examples", "calibrate", "content_free_inputs")


def compile_answer_regex(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"answer_regex {pattern!r} is not a valid regular expression: {exc}") from None
    if compiled.groups > 1:
        raise ValueError(f"answer_regex {pattern!r} has {compiled.groups} groups; use at most one")
    return compiled


class EvalTask(Task):
    name = "eval"
    options = {
        **ClassifyTask.options,
        "calibrate": None,  # label suites: content-free unless "none" (unset for the others)
        "expected_field": None,  # default: "label" for classify-style suites, else "answer"
        "choices_field": None,  # a list column: multiple choice
        "context_field": None,  # multiple choice: the context (else --prompt-template / --text-field)
        "target_delimiter": None,  # multiple choice: between context and choice (default " ")
        "answer_regex": None,
        "match": "exact",
        # A sweep (bulkrun.tasks.sweep): one run per combination; never reaches from_options itself.
        "sweep_model": None,
        "sweep_template": None,
        "sweep_temperature": None,
    }

    def __init__(
        self,
        classifier: ClassifyTask | None = None,
        *,
        expected_field: str | None = None,
        answer_regex: str | None = None,
        match: str = "exact",
        choices: MultipleChoice | None = None,
    ):
        if match not in MATCH_MODES:
            raise ValueError(f"match must be one of {', '.join(MATCH_MODES)}, got {match!r}")
        if classifier is not None and answer_regex is not None:
            raise ValueError("answer_regex applies to generation suites; a suite with labels scores them")
        self.classifier = classifier
        self.choices = choices
        if choices is not None:
            self.uses_text_field = choices.context_field is None
        self.expected_field = expected_field or ("label" if classifier else "answer")
        self.answer_regex = compile_answer_regex(answer_regex)
        self.normalized = match == "normalized"

    @classmethod
    def from_options(cls, options: dict) -> EvalTask:
        if any(options.get(key) for key in SWEEP_KEYS):
            raise ValueError("a sweep is run by `bulkrun eval` / `bulkrun run`, one job per combination")
        has_labels = options.get("labels") is not None or options.get("labels_file") is not None
        if options.get("choices_field") is not None:
            return cls._multiple_choice(options, has_labels)
        given = [k for k in ("context_field", "target_delimiter") if options.get(k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} need choices_field (a multiple-choice suite)")
        classifier = ClassifyTask.from_options(options) if has_labels else None
        if not has_labels:
            given = [k for k in LABEL_ONLY if options.get(k)]
            if given:
                raise ValueError(f"{', '.join(given)} need labels (a classify-style suite)")
        return cls(
            classifier,
            expected_field=options.get("expected_field"),
            answer_regex=options.get("answer_regex"),
            match=options.get("match") or "exact",
        )

    @classmethod
    def _multiple_choice(cls, options: dict, has_labels: bool) -> EvalTask:
        clashing = ["labels"] if has_labels else []
        clashing += [k for k in LABEL_ONLY if options.get(k)]
        clashing += [k for k in ("answer_regex",) if options.get(k) is not None]
        clashing += ["match"] if (options.get("match") or "exact") != "exact" else []
        if clashing:
            raise ValueError(f"choices_field (multiple choice) cannot be combined with {', '.join(clashing)}")
        expected_field = options.get("expected_field") or "answer"
        delimiter = options.get("target_delimiter")
        choices = MultipleChoice(
            options["choices_field"], expected_field, options.get("context_field"),
            TARGET_DELIMITER if delimiter is None else delimiter,
        )  # fmt: skip
        return cls(expected_field=expected_field, choices=choices)

    def named_fields(self) -> dict[str, str]:
        return self.choices.named_fields() if self.choices is not None else {}

    def bind(self, ctx: TaskContext) -> None:
        super().bind(ctx)
        if self.classifier is not None:
            self.classifier.bind(ctx)
        if self.choices is not None:
            self.choices.bind(ctx)

    def content_free_prompts(self) -> list[str]:
        return self.classifier.content_free_prompts() if self.classifier is not None else []

    def set_content_free(self, outputs) -> None:
        self.classifier.set_content_free(outputs)

    def render(self, item: Item) -> str:
        if self.choices is not None:
            return self.choices.render(item.fields)
        self.expected(item)  # a row without a usable answer fails before any engine work
        if self.classifier is not None:
            return self.classifier.render(item)
        messages = row_messages(item.fields, self.ctx)
        if messages is not None:
            return messages
        return prompt_text(item.fields, self.ctx.prompt_template, self.ctx.text_field)

    def takes_constraints(self) -> bool:
        return self.classifier is None  # a generation suite (a label suite scores its labels)

    def expected(self, item: Item) -> str:
        value = item.fields.get(self.expected_field)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise RowError("missing_expected", f"expected-answer field '{self.expected_field}' is missing")
        if isinstance(value, (dict, list, bytes)):
            kind = type(value).__name__
            raise RowError("bad_expected", f"expected-answer field '{self.expected_field}' is a {kind}")
        value = str(value)
        if self.classifier is None:
            return value
        label = self.classifier.labels.find(value)
        if label is None:
            raise RowError("unknown_label", f"expected label {value!r} is not one of the labels")
        return label

    def requests(self, item: Item, prompt_ids: list[int]) -> list[EngineRequest]:
        if self.choices is not None:
            return self.choices.requests(item.fields)
        if self.classifier is not None:
            return self.classifier.requests(item, prompt_ids)
        # Seeded from the item id, never the batch position: a resumed run samples the same answer.
        params = replace(self.ctx.sampling, seed=sample_seed(self.ctx.sampling.seed, item.id, 0))
        params = replace(params, constraint=row_constraint(self.ctx, item))
        return [EngineRequest("answer", prompt_ids, params)]

    def result(self, item: Item, outputs: list[RequestOutput]) -> dict:
        if self.choices is not None:
            return self.choices.result(item.fields, outputs[0])
        expected = self.expected(item)
        if self.classifier is not None:
            columns = self.classifier.label_columns(outputs[0])
            predicted = columns["label"]
            correct = predicted == expected
            if "raw_label" in columns:
                columns["raw_correct"] = columns["raw_label"] == expected
        else:
            columns = generation_columns(outputs[:1], 1)
            spec = row_constraint(self.ctx, item)
            columns |= output_columns(spec, outputs[:1], has_json_column(self.ctx, item), as_list=False)
            predicted = extract_answer(columns["text"], self.answer_regex)
            correct = answers_match(predicted, expected, self.normalized)
        return {"expected": expected, "predicted": predicted, "correct": correct, **columns}

    def summarize(self, results) -> dict | None:
        """One pass over the result records (a list or a stream)."""
        if self.choices is not None:
            return multiple_choice_metrics(results)
        if self.classifier is not None:
            return self._classification_metrics(results)
        return generation_metrics((bool(r["correct"]), r["predicted"] is not None) for r in results)

    def _classification_metrics(self, results) -> dict:
        raw_correct, prior = 0, None

        def pairs():
            nonlocal raw_correct, prior
            for record in results:
                raw_correct += bool(record.get("raw_correct", record["correct"]))
                prior = prior or record.get("label_prior")
                yield record["expected"], record["predicted"]

        metrics = classification_metrics(pairs(), self.classifier.labels.names)
        metrics["raw_accuracy"] = raw_correct / metrics["items"] if metrics["items"] else None
        metrics["calibration"] = self.classifier.calibration_summary(prior)
        return metrics

    def metrics_need_results(self) -> bool:
        return True
