"""Constrained generation, the task side: which constraint a row's samples follow, and the check that
turns each output into a record's `json` value or the row's `invalid_output` error record.

A row follows, first to last: its OpenAI batch line's `response_format` (json_schema, json_object;
"text" or none: free), its own schema in the --schema-field column (a null value: the job's), the
job's --json-schema / --regex / --choice. A row's schema that is malformed or cannot be compiled is
that row's error record (kind `invalid_schema`; the job-wide one stops the job before any work).

Outputs are never patched: one that does not parse or validate, or that max_tokens cut short, makes
the row an `invalid_output` error record whose message keeps the text. JSON-constrained rows get a
`json` column (the value as compact JSON text: one Parquet type whatever each row's shape).
"""

from __future__ import annotations

import json

from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.structured_output.grammar import ConstraintSpec, GrammarError
from bulkrun.engine.structured_output.output import check_output
from bulkrun.exceptions import RowError
from bulkrun.tasks.base import Item, TaskContext

JSON_KINDS = ("json_schema", "json_object")


def is_openai_line(fields: dict) -> bool:
    return "body" in fields and "custom_id" in fields


def row_constraint(ctx: TaskContext, item: Item) -> ConstraintSpec | None:
    fields = item.fields
    if is_openai_line(fields):
        spec, where = openai_constraint(fields["body"]), "body.response_format"
    elif ctx.schema_field is not None and fields.get(ctx.schema_field) is not None:
        where = f"schema field '{ctx.schema_field}'"
        try:
            spec = ConstraintSpec.json_schema(fields[ctx.schema_field])
        except GrammarError as exc:
            raise RowError("invalid_schema", f"{where}: {exc}") from None
    else:
        return ctx.constraint
    if spec is not None and ctx.compile is not None:
        try:
            ctx.compile(spec)  # cached per engine: a schema shared by many rows compiles once
        except GrammarError as exc:
            raise RowError("invalid_schema", f"{where}: {exc}") from None
    return spec


def openai_constraint(body: dict) -> ConstraintSpec | None:
    """The constraint of an OpenAI request body's response_format."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec.json_object()
    if kind == "json_schema":
        schema = (
            (fmt.get("json_schema") or {}).get("schema") if isinstance(fmt.get("json_schema"), dict) else None
        )
        if schema is None:
            raise RowError("invalid_request", "response_format json_schema needs json_schema.schema")
        try:
            return ConstraintSpec.json_schema(schema)
        except GrammarError as exc:
            raise RowError("invalid_schema", f"body.response_format: {exc}") from None
    raise RowError(
        "invalid_request", f"response_format type must be text, json_object or json_schema, got {kind!r}"
    )


def has_json_column(ctx: TaskContext, item: Item) -> bool:
    """Whether the job's records carry a `json` column (the same for every row of a job)."""
    job_json = ctx.constraint is not None and ctx.constraint.kind in JSON_KINDS
    return job_json or ctx.schema_field is not None or is_openai_line(item.fields)


def output_columns(
    spec: ConstraintSpec | None, outputs: list[RequestOutput], with_json: bool, as_list: bool
) -> dict:
    """The `json` column (when `with_json`), after every output passed its constraint's check."""
    values = []
    for k, out in enumerate(outputs):
        value = None
        if spec is not None:
            check = check_output(spec, out.text, out.finish_reason)
            if not check.ok:
                sample = f"sample {k}: " if len(outputs) > 1 else ""
                raise RowError("invalid_output", f"{sample}{check.message}; text: {out.text!r}")
            if spec.kind in JSON_KINDS:
                value = json.dumps(check.value, ensure_ascii=False, separators=(",", ":"))
        values.append(value)
    if not with_json:
        return {}
    return {"json": values if as_list else values[0]}


def imported_output_columns(record: dict, fields: dict, job: dict) -> dict:
    """The `json` column of a record that came back from a provider's batch tier, after the same
    check a local run makes (RowError `invalid_output` when it fails). `fields`: the row's input
    fields that decide its constraint (an OpenAI line's body, the schema field); `job`: what the
    export recorded (json_schema, schema_field, openai_input)."""
    spec: ConstraintSpec | None = None
    try:
        if job.get("openai_input") and isinstance(fields.get("body"), dict):
            spec = openai_constraint(fields["body"])
        elif job.get("schema_field") and fields.get(job["schema_field"]) is not None:
            spec = ConstraintSpec.json_schema(fields[job["schema_field"]])
        elif job.get("json_schema") is not None:
            spec = ConstraintSpec.json_schema(job["json_schema"])
    except GrammarError as exc:
        raise RowError("invalid_schema", str(exc)) from None
    with_json = bool(job.get("openai_input") or job.get("schema_field") or job.get("json_schema") is not None)
    texts, reasons = record["text"], record["finish_reason"]
    as_list = isinstance(texts, list)
    outputs = [
        _ImportedOutput(text, reason)
        for text, reason in zip(texts if as_list else [texts], reasons if as_list else [reasons], strict=True)
    ]
    return output_columns(spec, outputs, with_json, as_list)


class _ImportedOutput:
    """A provider's output as the two fields of a RequestOutput that output_columns reads."""

    __slots__ = ("text", "finish_reason")

    def __init__(self, text: str, finish_reason: str):
        self.text, self.finish_reason = text, finish_reason
