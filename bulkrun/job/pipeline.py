"""A job's input pipeline, built here once for run, plan and batch prepare:
rows (io/readers) -> ids (the one id rule below) -> prompts (PromptBuilder) -> windows (Feed).

The id rule: an OpenAI batch input's ids are its custom_ids; else --id-field; else an `id` (or
`custom_id`) column of the input (JSONL: of its first --window rows); else the row number. A job
records the answer in its manifest when it begins, so every later run and every command that reads
the same job (batch prepare) uses the same ids; `plan`, which writes no manifest, asks the rule itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from bulkrun.exceptions import UsageError
from bulkrun.io.formats import OPENAI
from bulkrun.io.readers import input_columns, read_rows
from bulkrun.job.constraints import compile_job_constraint, job_constraint
from bulkrun.job.feed import Feed, IdRegistry, PromptBuilder
from bulkrun.job.resume import RowSet
from bulkrun.tasks.base import Task, TaskContext
from bulkrun.tasks.reasoning import reasoning_format

ID_COLUMNS = ("id", "custom_id")  # taken as the id when --id-field is not given, in this order


def given_ids(spec, fmt: str) -> dict | None:
    """Where ids come from when the input's format or --id-field says so (None: not said)."""
    if fmt == OPENAI:
        return {"field": "custom_id", "source": "openai batch"}
    if spec.id_field is not None:
        return {"field": spec.id_field, "source": "--id-field"}
    return None


def resolve_ids(spec, input_path: Path, fmt: str) -> dict:
    """The id rule's answer for this input: {"field": name or None, "source": why}."""
    given = given_ids(spec, fmt)
    if given is not None:
        return given
    columns, _ = input_columns(input_path, fmt, spec.window)
    found = next((name for name in ID_COLUMNS if name in (columns or ())), None)
    return {"field": found, "source": "input column" if found else "row number"}


def task_context(spec, model, compile_constraints: bool = True) -> TaskContext:
    """What the task needs of the model (an Engine, or batch prepare's PromptSide) to make requests.
    `compile_constraints=False` where another system enforces them (a provider's batch tier:
    batch prepare sends the schema, batch collect checks each output)."""
    tokenizer = model.tokenizer
    if spec.chat_template and not getattr(tokenizer, "chat_template", None):
        raise UsageError("the model has no chat template; pass --no-chat-template to use plain prompts")
    constraint = job_constraint(spec)
    return TaskContext(
        tokenizer=tokenizer,
        max_model_len=model.max_model_len,
        sampling=spec.sampling(),
        n=spec.n,
        text_field=spec.text_field,
        prompt_template=spec.prompt_template,
        messages_field=spec.messages_field,
        constraint=constraint,
        schema_field=spec.schema_field,
        compile=compile_job_constraint(spec, constraint, model) if compile_constraints else None,
        reasoning=reasoning_format(tokenizer),
        embedding_profile=getattr(model, "embedding_profile", None),
    )


class InputPipeline(NamedTuple):
    builder: PromptBuilder  # also renders the task's own prompts (calibration) and provider messages
    feed: Feed


def input_pipeline(
    spec,
    task: Task,
    model,
    *,
    fmt: str,
    id_field: str | None,
    done: RowSet | None = None,
    sort: bool = False,
    select: Callable[[int], bool] | None = None,
    compile_constraints: bool = True,
) -> InputPipeline:
    """Bind `task` to `model` and stream `spec.input` through it: skips the rows in `done` and those
    `select` refuses; sorts each window by prompt length when `sort` (a run; plan and export keep
    input order)."""
    task.bind(task_context(spec, model, compile_constraints))
    builder = PromptBuilder(
        task, model.tokenizer, chat_template=spec.chat_template, system=spec.system,
        max_model_len=model.max_model_len, chat_template_kwargs=spec.chat_template_kwargs,
    )  # fmt: skip
    feed = Feed(
        read_rows(Path(spec.input), fmt), builder, IdRegistry(id_field),
        done=RowSet() if done is None else done, window=spec.window, sort=sort, select=select,
    )  # fmt: skip
    return InputPipeline(builder, feed)
