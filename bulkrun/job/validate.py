"""Everything that checks a job before any work, in one place; each failure one clear line (UsageError:
exit 2, InputError: exit 4).

- `check_spec(spec)`: the spec's own values, when it is built (build_spec): sizes, limits, sampling,
  the prompt template, the constraint (its schema file read), the kernel backend against the device;
- `check_input(spec)`: the task built from its options, constraints only on generating tasks, the
  input's format and every field an option names; `open_job` and `plan` call it first.
What spreads a job (--ray, --workers, --shard combinations) is checked in bulkrun/distributed/options.py
before any of this runs; the model is resolved by session.resolve_model (exit 5).
"""

from __future__ import annotations

from pathlib import Path

from bulkrun.exceptions import UsageError
from bulkrun.io.formats import OPENAI, detect_format
from bulkrun.io.readers import check_columns
from bulkrun.job.constraints import constraint_flags, job_constraint
from bulkrun.job.slices import parse_shard
from bulkrun.job.spec import JobSpec, parse_checkpoint, task_class
from bulkrun.tasks.base import Task, template_fields
from bulkrun.tasks.chat import MESSAGES


def check_spec(spec: JobSpec) -> None:
    """The spec's own values (no file opened): sizes, limits, sampling, templates, the constraint."""
    if spec.input is None:
        raise UsageError("no input file given")
    for name in ("window", "n", "max_tokens"):
        minimum = 0 if name == "max_tokens" else 1
        if getattr(spec, name) < minimum:
            raise UsageError(f"{name} must be >= {minimum}, got {getattr(spec, name)}")
    parse_checkpoint(spec.checkpoint_every)
    if spec.shard is not None:
        parse_shard(spec.shard)
    spec.engine_config()  # sizes, limits, the kernel backend's name
    _check_kernels_fit_device(spec)
    if spec.prompt_template is not None:
        try:
            template_fields(spec.prompt_template)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    spec.sampling()  # raises UsageError for invalid sampling values
    job_constraint(spec)  # a missing or malformed schema file, two constraints at once


def _check_kernels_fit_device(spec: JobSpec) -> None:
    """A forced kernel backend that cannot run on this run's device is a bad flag, found before any
    work (not a model-load failure at the first engine). Ray runs are left to their workers, whose
    devices the driver cannot see."""
    if spec.ray is not None or spec.kernels not in ("triton", "cpu"):
        return
    from bulkrun.engine.worker.device import resolve_device

    try:
        on_cuda = resolve_device(spec.device).type == "cuda"
    except RuntimeError:
        raise UsageError(f"device must be cpu or cuda (cuda:N), got {spec.device!r}") from None
    if spec.kernels == "triton" and not on_cuda:
        raise UsageError(
            "--kernels triton needs a CUDA device and this run is on the CPU; use auto, cpu or reference"
        )
    if spec.kernels == "cpu" and on_cuda:
        raise UsageError(
            "--kernels cpu runs on the CPU and this run is on CUDA; use auto, triton or reference"
        )


def check_input(spec: JobSpec) -> tuple[Task, Path, str]:
    """The job's task, its input's path and format, once everything they can be checked for is."""
    task = build_task(spec)
    check_task_takes_constraints(spec, task)
    input_path = Path(spec.input)
    fmt = detect_format(input_path)
    check_named_fields(spec, task, input_path, fmt)
    return task, input_path, fmt


def named_fields(spec: JobSpec, task: Task) -> dict[str, str]:
    """The input fields the options name: field -> the option that names it."""
    named = {}
    if spec.prompt_template is not None:
        named.update({name: "--prompt-template" for name in template_fields(spec.prompt_template)})
    elif spec.messages_field is not None:
        named[spec.messages_field] = "--messages-field"
    elif task.uses_text_field:
        named[spec.text_field] = "--text-field"
    if spec.id_field is not None:
        named[spec.id_field] = "--id-field"
    if spec.schema_field is not None:
        named[spec.schema_field] = "--schema-field"
    named.update({name: "--keep-field" for name in spec.keep_fields})
    named.update(task.named_fields())
    return named


def check_named_fields(spec: JobSpec, task: Task, path: Path, fmt: str) -> None:
    """Every field an option names must be in the input (OpenAI batch lines have their own shape)."""
    if fmt == OPENAI:
        return
    named = named_fields(spec, task)
    window = spec.window
    text_named = named.get(spec.text_field) == "--text-field" and _takes_messages(task)
    if text_named and not _has_field(path, fmt, spec.text_field, window):
        if _has_field(path, fmt, MESSAGES, window):  # a chat dataset: its `messages` are the prompts
            del named[spec.text_field]
        else:
            try:
                check_columns(path, fmt, named, window)
            except UsageError as exc:
                raise UsageError(f"{exc}; nor is there a '{MESSAGES}' column of chat messages") from None
    check_columns(path, fmt, named, window)


def _has_field(path: Path, fmt: str, name: str, window: int) -> bool:
    try:
        check_columns(path, fmt, {name: ""}, window)
    except UsageError:
        return False
    return True


def _takes_messages(task: Task) -> bool:
    return task.takes_constraints()  # the generating tasks: generate, summarize, eval generation suites


def build_task(spec: JobSpec) -> Task:
    cls = task_class(spec.task)
    try:
        return cls.from_options(dict(spec.task_options))
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{spec.task}: {exc}") from None


def check_task_takes_constraints(spec, task) -> None:
    flags = constraint_flags(spec)
    if flags and not task.takes_constraints():
        raise UsageError(
            f"{flags}: constraints apply to generate, summarize and eval generation suites, not to {spec.task}"
            + (" with labels" if spec.task == "eval" else "")
        )
