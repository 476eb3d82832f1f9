"""The job-wide constraint (--json-schema FILE, --regex, --choice), checked before any work.

`job_constraint(spec)` reads and checks it when the spec is built (validate.py: a missing or malformed
schema file, two constraints at once; a constraint on a task that does not generate is refused there
too: exit 2 naming the problem);
`compile_job_constraint` compiles it with the engine's tokenizer as soon as the engine is loaded, before
the first row (a schema the grammar engine cannot compile, or not within its time limit: exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

from bulkrun.engine.structured_output.grammar import ConstraintSpec, GrammarError
from bulkrun.exceptions import UsageError


def _given(spec) -> list[str]:
    return [flag for flag, value in (("--json-schema", spec.json_schema), ("--regex", spec.regex),
                                     ("--choice", spec.choice)) if value]  # fmt: skip


def constraint_flags(spec) -> str:
    """The constraint options the spec sets, for messages ('' when none)."""
    return ", ".join(_given(spec) + (["--schema-field"] if spec.schema_field else []))


def job_constraint(spec) -> ConstraintSpec | None:
    given = _given(spec)
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} cannot be combined: give one constraint per job")
    try:
        if spec.json_schema:
            return ConstraintSpec.json_schema(read_schema_file(spec.json_schema))
        if spec.regex:
            return ConstraintSpec.regex(spec.regex)
        if spec.choice:
            return ConstraintSpec.choice(choice_list(spec.choice))
    except GrammarError as exc:
        raise UsageError(f"{given[0]}: {exc}") from None
    return None


def choice_list(values: list[str]) -> list[str]:
    """--choice a,b,c (one comma-separated value) or a spec list ["a", "b", "c"]."""
    if len(values) == 1:
        return [v.strip() for v in values[0].split(",")]
    return list(values)


def read_schema_file(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UsageError(f"--json-schema '{path}' does not exist") from None
    except OSError as exc:
        raise UsageError(f"--json-schema '{path}' cannot be read: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--json-schema '{path}' is not valid JSON: {exc}") from None


def compile_job_constraint(spec, constraint: ConstraintSpec | None, engine):
    """The engine's compile function (for per-row schemas too), after compiling the job's constraint."""
    constrained = getattr(engine, "constrained", None)
    if constrained is None:
        if constraint is not None or spec.schema_field:
            raise UsageError("this engine does not support constrained generation")
        return None
    if constraint is not None:
        try:
            constrained.cache.compile(constraint)
        except GrammarError as exc:
            raise UsageError(f"{_given(spec)[0]}: {exc}") from None

    def compile(row_constraint: ConstraintSpec):
        # the grammar tokenizer (a walk of the vocabulary) is prepared when a row first needs it
        return constrained.cache.compile(row_constraint)

    return compile
