"""Multiple-choice rows scored the way lm-evaluation-harness scores its `multiple_choice` tasks.

Each row brings its own context, its own choices (any count) and the expected answer. As in
lm-evaluation-harness (lm_eval/api/task.py, lm_eval/models/huggingface.py):
- every choice is the continuation `target_delimiter + choice` of the context; the delimiter is " "
  by default and "" when the chat template is applied;
- trailing whitespace of the context moves to the front of the continuation (`_encode_pair`), and
  the continuation's tokens are those of tokenize(context + continuation) after the first
  len(tokenize(context)) ids; an empty context is the prefix token alone (BOS, else EOS);
- a choice's log-likelihood is the sum of its continuation tokens' log-probabilities;
  `acc` picks the largest, `acc_norm` the largest divided by the choice's length in characters
  (len() of the choice string, without the delimiter); ties go to the first choice (numpy.argmax);
- the expected answer is an index into the choices or the text of one of them.
Where bulkrun differs (it refuses what lm-evaluation-harness would score silently): an
out-of-range or negative index, an answer that is not a choice, an empty choice list or an empty
choice are row errors; a context too long for the model is a row error instead of being cut on the
left; an empty context is a row error (lm-evaluation-harness scores the choices after BOS alone);
a digit string that is not itself a choice is read as an index (CSV has no integer type). The
context is scored as plain text: the chat template is not applied to multiple-choice rows (as
lm-evaluation-harness without --apply_chat_template).
Not carried over: several expected answers per row (lm-eval's multiple targets), `exact_match`
(whether the expected choice is the greedy continuation) and `acc_mutual_info`.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.core.params import EngineRequest
from bulkrun.tasks.base import RawText, RowError, TaskContext, prompt_text
from bulkrun.tasks.calibration import argmax
from bulkrun.tasks.continuations import scoring_request

TARGET_DELIMITER = " "  # lm-evaluation-harness's default `target_delimiter`
CHAT_TARGET_DELIMITER = ""  # what it uses instead when the chat template is applied


@dataclass(frozen=True, slots=True)
class ChoiceRow:
    choices: tuple[str, ...]
    gold: int  # index of the expected choice


def parse_choices(value, field_name: str = "choices") -> tuple[str, ...]:
    """The row's choices: a list of non-empty strings (a JSON list in a string, for CSV input)."""
    if value is None:
        raise RowError("missing_choices", f"choices field '{field_name}' is missing")
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowError("bad_choices", f"choices field '{field_name}' is not a JSON list: {exc}") from None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        kind = type(value).__name__
        raise RowError("bad_choices", f"choices field '{field_name}' is a {kind}, not a list")
    choices = tuple(value)
    if not choices:
        raise RowError("empty_choices", f"choices field '{field_name}' is an empty list")
    for number, choice in enumerate(choices):
        if not isinstance(choice, str):
            kind = type(choice).__name__
            raise RowError("bad_choices", f"choice {number} is a {kind}, not a string")
        if not choice:  # its acc_norm length would be 0
            raise RowError("bad_choices", f"choice {number} is an empty string")
    return choices


def expected_index(value, choices: Sequence[str], field_name: str = "answer") -> int:
    """The expected answer as an index into `choices`: an integer index, or a choice's text."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise RowError("missing_expected", f"expected-answer field '{field_name}' is missing")
    if isinstance(value, bool):
        raise RowError("bad_expected", f"expected-answer field '{field_name}' is a bool")
    if isinstance(value, float) and value.is_integer():  # an integer column with nulls, read by pandas
        value = int(value)
    if isinstance(value, str):
        if value in choices:
            return choices.index(value)  # the first of equal choices, as lm-evaluation-harness
        if not value.strip().isdigit():
            raise RowError("expected_not_a_choice", f"expected answer {value!r} is not one of the choices")
        value = int(value.strip())
    if not isinstance(value, numbers.Integral):  # numpy integers from Parquet too
        kind = type(value).__name__
        raise RowError("bad_expected", f"expected-answer field '{field_name}' is a {kind}")
    value = int(value)
    if not 0 <= value < len(choices):
        raise RowError(
            "expected_out_of_range",
            f"expected answer index {value} is out of range for {len(choices)} choices",
        )
    return value


def parse_row(fields: Mapping, choices_field: str, expected_field: str) -> ChoiceRow:
    choices = parse_choices(fields.get(choices_field), choices_field)
    return ChoiceRow(choices, expected_index(fields.get(expected_field), choices, expected_field))


def continuations(choices: Sequence[str], target_delimiter: str = TARGET_DELIMITER) -> list[str]:
    """What follows the context for each choice."""
    return [f"{target_delimiter}{choice}" for choice in choices]


def move_trailing_whitespace(context: str, continuation: str) -> tuple[str, str]:
    """`Answer: ` + `x` -> `Answer:` + ` x`: a word's leading space belongs to the word's token."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def encode_pair(
    encode: Callable[[str], list[int]], context: str, continuation: str, prefix_token_id: int
) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-evaluation-harness tokenizes a loglikelihood request.

    `encode` tokenizes without special tokens; `prefix_token_id` (BOS, else EOS) stands for an empty
    context. A context of whitespace only is empty too once its whitespace has moved."""
    if not context:
        return [prefix_token_id], list(encode(continuation))
    context, continuation = move_trailing_whitespace(context, continuation)
    if not context:
        return [prefix_token_id], list(encode(continuation))
    whole = list(encode(context + continuation))
    context_ids = list(encode(context))
    return context_ids, whole[len(context_ids) :]


def encode_choices(
    encode: Callable[[str], list[int]],
    context: str,
    choices: Sequence[str],
    prefix_token_id: int,
    target_delimiter: str = TARGET_DELIMITER,
) -> tuple[list[int], list[list[int]]]:
    """The shared context ids and each choice's continuation ids: one engine request per row.
    The context ids never depend on the choice (only the context's own whitespace moves)."""
    pairs = [
        encode_pair(encode, context, c, prefix_token_id) for c in continuations(choices, target_delimiter)
    ]
    for number, (_, ids) in enumerate(pairs):
        if not ids:
            raise RowError("bad_choices", f"choice {number} has no tokens after the context")
    return pairs[0][0], [ids for _, ids in pairs]


def choice_columns(row: ChoiceRow, loglikelihoods: Sequence[float]) -> dict:
    """The result record's columns for one row from its per-choice log-likelihoods."""
    if len(loglikelihoods) != len(row.choices):
        raise ValueError(f"{len(loglikelihoods)} log-likelihoods for {len(row.choices)} choices")
    lls = [float(x) for x in loglikelihoods]
    pred = argmax(lls)
    pred_norm = argmax([ll / len(choice) for ll, choice in zip(lls, row.choices, strict=True)])
    return {
        "expected": row.choices[row.gold],
        "expected_index": row.gold,
        "loglikelihoods": lls,
        "predicted": row.choices[pred],
        "predicted_index": pred,
        "predicted_norm": row.choices[pred_norm],
        "predicted_norm_index": pred_norm,
        "correct": pred == row.gold,
        "correct_norm": pred_norm == row.gold,
    }


def mean_stderr(hits: int, n: int) -> float | None:
    """lm-evaluation-harness's `mean_stderr` of 0/1 scores: sample standard deviation / sqrt(n)."""
    if n < 2:
        return None
    mean = hits / n
    variance = (hits * (1 - mean) ** 2 + (n - hits) * mean**2) / (n - 1)
    return math.sqrt(variance / n)


def multiple_choice_metrics(records: Iterable[Mapping]) -> dict:
    """acc and acc_norm (with their standard errors) over the scored rows' result records."""
    items = correct = correct_norm = 0
    for record in records:
        items += 1
        correct += bool(record["correct"])
        correct_norm += bool(record["correct_norm"])
    acc = correct / items if items else None
    return {
        "kind": "multiple_choice",
        "items": items,
        "correct": correct,
        "correct_norm": correct_norm,
        "accuracy": acc,  # the sweep table's column
        "acc": acc,
        "acc_norm": correct_norm / items if items else None,
        "acc_stderr": mean_stderr(correct, items),
        "acc_norm_stderr": mean_stderr(correct_norm, items),
    }


def metrics_lines(metrics: Mapping) -> list[str]:
    """Human lines for the end-of-job summary."""
    if not metrics["items"]:
        return ["acc n/a (no scored rows)"]
    lines = []
    for name, hits in (("acc", metrics["correct"]), ("acc_norm", metrics["correct_norm"])):
        stderr = metrics[f"{name}_stderr"]
        spread = "" if stderr is None else f" ± {stderr:.1%}"
        lines.append(f"{name:<8} {metrics[name]:.1%}{spread} ({hits}/{metrics['items']})")
    return lines


class MultipleChoice:
    """The multiple-choice side of `bulkrun eval`: a row's context, its choices in one engine request
    (the context's KV computed once, every choice scored as a continuation of it), its columns."""

    def __init__(self, choices_field: str, expected_field: str, context_field: str | None = None,
                 target_delimiter: str = TARGET_DELIMITER):  # fmt: skip
        self.choices_field, self.expected_field = choices_field, expected_field
        self.context_field, self.target_delimiter = context_field, target_delimiter

    def named_fields(self) -> dict[str, str]:
        named = {self.choices_field: "--choices-field", self.expected_field: "--expected-field"}
        if self.context_field is not None:
            named[self.context_field] = "--context-field"
        return named

    def bind(self, ctx: TaskContext) -> None:
        self.ctx = ctx
        tokenizer = ctx.tokenizer
        bos = tokenizer.bos_token_id
        self.prefix_token_id = bos if bos is not None else tokenizer.eos_token_id
        self.encode = lambda text: tokenizer.encode(text, add_special_tokens=False)

    def context(self, fields: Mapping) -> str:
        if self.context_field is not None:
            return prompt_text(fields, None, self.context_field)
        return prompt_text(fields, self.ctx.prompt_template, self.ctx.text_field)

    def row(self, fields: Mapping) -> ChoiceRow:
        return parse_row(fields, self.choices_field, self.expected_field)

    def render(self, fields: Mapping) -> RawText:
        self.row(fields)  # a row without usable choices or answer fails before any engine work
        return RawText(self.context(fields))

    def requests(self, fields: Mapping) -> list[EngineRequest]:
        row = self.row(fields)
        context_ids, ids = encode_choices(
            self.encode, self.context(fields), row.choices, self.prefix_token_id, self.target_delimiter
        )
        return [scoring_request("choices", context_ids, ids, self.ctx.max_model_len, "its longest choice")]

    def result(self, fields: Mapping, output: RequestOutput) -> dict:
        if output.finish_reason == "error" or output.continuation_logprobs is None:
            raise RowError("engine_error", output.error or "the engine returned no choice scores")
        return choice_columns(self.row(fields), [float(sum(lps)) for lps in output.continuation_logprobs])
