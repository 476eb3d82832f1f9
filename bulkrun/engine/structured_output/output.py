"""The check a constrained output passes before it becomes a record: parse and validate, never patch.

An output cut by max_tokens is reported as "truncated" (the fix is a larger max_tokens), anything else
that does not parse or validate as "invalid"; the job layer turns both into `invalid_output` error
records that keep the text. Validation uses the `jsonschema` package (formats checked too), independent
of the grammar engine, so a grammar-engine bug cannot pass a bad record.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from bulkrun.engine.structured_output.grammar import ConstraintSpec

if TYPE_CHECKING:
    import jsonschema

Problem = Literal["truncated", "invalid"]


@dataclass(frozen=True, slots=True)
class OutputCheck:
    ok: bool
    value: Any = None  # the parsed JSON for json_schema / json_object specs
    problem: Problem | None = None
    message: str = ""


def check_output(spec: ConstraintSpec, text: str, finish_reason: str) -> OutputCheck:
    """Validate `text` against `spec`. finish_reason "length" means max_tokens cut the output."""
    failure = _failure(spec, text)
    if failure is None:
        return OutputCheck(True, json.loads(text) if spec.schema is not None else None)
    if finish_reason == "length":
        return OutputCheck(
            False, problem="truncated", message=f"output cut by max_tokens before it was complete ({failure})"
        )
    return OutputCheck(False, problem="invalid", message=failure)


def _failure(spec: ConstraintSpec, text: str) -> str | None:
    """Why `text` does not satisfy `spec`, or None when it does."""
    if spec.kind == "regex":
        return None if re.fullmatch(spec.value, text) else f"does not match the regex {spec.value!r}"
    if spec.kind == "choice":
        return None if text in spec.choices else f"not one of {spec.choices}"
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not valid JSON: {e}"
    import jsonschema  # here: a job without a JSON constraint never loads it

    validator = jsonschema.validators.validator_for(spec.schema)(
        spec.schema, format_checker=jsonschema.FormatChecker()
    )
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    return None if error is None else f"fails the schema at {_where(error)}: {error.message}"


def _where(error: jsonschema.ValidationError) -> str:
    return "/" + "/".join(str(p) for p in error.absolute_path)
