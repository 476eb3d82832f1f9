"""The contract between the job layer and a task (generate, summarize, classify, eval).

The job layer reads rows into Items, asks the task to render each one into a prompt, applies the chat
template and tokenizes (in batches), asks the task for the engine requests of that prompt, and finally
hands the finished outputs back to the task to build the task's columns of the result record.

A task never touches files, windows, shards or the engine loop; it only maps one item to requests and
outputs to columns. A bad row is reported by raising RowError; the job records it and goes on.
"""

from __future__ import annotations

import string
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.core.params import EngineRequest, SamplingParams
from bulkrun.exceptions import RowError


@dataclass(slots=True)
class Item:
    index: int  # row number in the input, 0-based (JSONL: line number); unique and stable across runs
    id: str  # from the id field (--id-field, else an `id` / `custom_id` column), else str(index)
    fields: dict  # the row's columns (OpenAI batch lines: {"messages": [...], "body": {...}})


class RawText(str):
    """A rendered prompt used exactly as given: never wrapped in the chat template (e.g. an
    OpenAI /v1/completions prompt)."""


@dataclass(slots=True)
class TaskContext:
    """What a task may need besides the item: given once, before any item, by the job layer."""

    tokenizer: Any  # the model's HF tokenizer (e.g. to tokenize label continuations)
    max_model_len: int
    sampling: SamplingParams  # the job's sampling settings (seed = job seed)
    n: int = 1  # samples per row
    text_field: str = "text"  # --text-field
    prompt_template: str | None = None  # --prompt-template ({field} placeholders)
    messages_field: str | None = None  # --messages-field (None: a `messages` column when there is no text)
    # constrained generation (tasks/constraints.py): the job's grammar.ConstraintSpec, the column of
    # per-row schemas, and the engine's compile (cached; raises GrammarError)
    constraint: Any = None
    schema_field: str | None = None
    compile: Any = None
    # how the model's outputs split into reasoning and answer (tasks/reasoning.py); None: it does not reason
    reasoning: Any = None
    # the model directory's sentence-transformers profile (model/sentence_transformers_config.py):
    # pooling, normalize, max length, prompts; what embed starts from
    embedding_profile: Any = None


class Task(ABC):
    """One kind of bulk work. Subclasses set `name` and implement render/requests/result."""

    name: str = ""
    # Task-specific options (spec keys / CLI flags beyond the shared ones) with their defaults,
    # e.g. classify: {"labels": None, "labels_file": None}. The job layer refuses other keys.
    options: ClassVar[dict[str, Any]] = {}
    # Options that do not change results (left out of the job fingerprint).
    cosmetic_options: ClassVar[frozenset[str]] = frozenset()
    # Defaults of shared options that suit this task better (e.g. summarize: more max_tokens);
    # a spec or a flag still overrides them.
    default_overrides: ClassVar[dict[str, Any]] = {}
    # Whether render() reads --text-field (without --prompt-template): the job layer then checks,
    # before any work, that the input has that field.
    uses_text_field: ClassVar[bool] = True
    # Whether requests() handles prompts longer than the model's context itself (embed truncates them);
    # otherwise the job layer makes such a row a prompt_too_long error record.
    truncates_prompts: ClassVar[bool] = False
    # The model alias the task runs on when the job names none (None: the default generator).
    default_model: ClassVar[str | None] = None

    @classmethod
    def from_options(cls, options: dict) -> Task:
        """Build the task from its options (defaults filled in); raise ValueError for a bad value."""
        return cls(**options)

    def bind(self, ctx: TaskContext) -> None:
        """Called once before any item; override to precompute (e.g. tokenize labels)."""
        self.ctx = ctx

    @abstractmethod
    def render(self, item: Item) -> str | list[dict]:
        """The prompt: plain text (wrapped as one user message, plus --system, when the chat template
        is applied) or a list of chat messages. Raise RowError for a row that cannot be rendered."""

    @abstractmethod
    def requests(self, item: Item, prompt_ids: list[int]) -> list[EngineRequest]:
        """The engine requests of this item. request_id must be unique within the item; the job layer
        prefixes it to make it unique in the engine, and hands the outputs back in this order."""

    @abstractmethod
    def result(self, item: Item, outputs: list[RequestOutput]) -> dict:
        """The task's columns of the result record (plain JSON-able values). Raise RowError to turn
        the item into an error record instead."""

    def named_fields(self) -> dict[str, str]:
        """Input fields this task's own options name (field -> the flag), checked before any work."""
        return {}

    def takes_constraints(self) -> bool:
        """Whether the task generates text that --json-schema / --regex / --choice can constrain."""
        return False

    def summarize(self, results: list[dict]) -> dict | None:
        """End-of-job metrics over all result records (eval); None when the task has none."""
        return None

    def metrics_need_results(self) -> bool:
        """True if summarize() wants the result records (the job layer then streams them once)."""
        return False


# ---- helpers shared by tasks ---------------------------------------------------------------------


def template_fields(template: str) -> list[str]:
    """The plain `{name}` placeholders of a template; raises ValueError for anything fancier."""
    names = []
    for _, name, spec, conv in string.Formatter().parse(template):
        if name is None:
            continue
        if not name.isidentifier() or spec or conv:
            raise ValueError(f"prompt template placeholder '{{{name}}}' must be a plain {{field}} name")
        names.append(name)
    return names


def fill_template(template: str, fields: dict) -> str:
    """Fill `{field}` placeholders from the row; a missing field is a RowError."""
    values = {}
    for name in template_fields(template):
        if name not in fields:
            raise RowError("template_field_missing", f"prompt template needs field '{name}'")
        if fields[name] is None:
            raise RowError("null_field", f"prompt template field '{name}' is null")
        values[name] = _as_text(fields[name], name)
    return template.format_map(values)


def _as_text(value: Any, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RowError("invalid_utf8", f"field '{name}' is not valid UTF-8: {exc.reason}") from None
    if isinstance(value, str):
        _check_encodable(value, name)
        return value
    return str(value)


def _check_encodable(value: str, name: str) -> None:
    # JSON "\ud800" escapes give lone surrogates: valid JSON, not valid UTF-8 text.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RowError("invalid_utf8", f"field '{name}' is not valid UTF-8: {exc.reason}") from None


def text_field(fields: dict, name: str) -> str:
    """The row's text field, checked: present, a string, not empty."""
    if name not in fields:
        raise RowError("missing_field", f"field '{name}' is missing")
    if fields[name] is None:
        raise RowError("null_field", f"field '{name}' is null")
    value = fields[name]
    if not isinstance(value, str | bytes):
        raise RowError("not_a_string", f"field '{name}' is {type(value).__name__}, not a string")
    value = _as_text(value, name)
    if not value.strip():
        raise RowError("empty_text", f"field '{name}' is empty")
    return value


def sample_seed(job_seed: int | None, item_id: str, sample: int) -> int | None:
    """A per-sample seed from (job seed, item id, sample index): never from batch position, so a
    resumed or re-sorted run draws the same samples. None stays None only for greedy single samples."""
    import hashlib

    base = 0 if job_seed is None else job_seed
    digest = hashlib.blake2b(f"{base}\x00{item_id}\x00{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def generation_columns(
    outputs: list[RequestOutput], n: int, *, as_lists: bool = False, reasoning=None
) -> dict:
    """text / finish_reason / token counts; scalars for one sample, lists (per sample) for --n > 1
    or when `as_lists` (a column's type must not change from row to row). With a reasoning model's
    format (TaskContext.reasoning), also `reasoning`, and `text` holds only the answer."""
    texts = [o.text for o in outputs]
    reasons = [o.finish_reason for o in outputs]
    generated = [len(o.output_token_ids) for o in outputs]
    prompt_tokens = len(outputs[0].prompt_token_ids) if outputs else 0
    columns = {"text": texts, "finish_reason": reasons}
    if reasoning is not None:
        split = reasoning.split(outputs)
        columns = {"text": [s[1] for s in split], "reasoning": [s[0] for s in split],
                   "finish_reason": [s[2] for s in split]}  # fmt: skip
    single = n == 1 and not as_lists
    out = {key: values[0] if single else values for key, values in columns.items()}
    return out | {"prompt_tokens": prompt_tokens, "generated_tokens": generated[0] if single else generated}


def prompt_text(fields: dict, template: str | None, field_name: str) -> str:
    """The prompt text of a row: the template filled from its fields, else its text field."""
    if template is None:
        return text_field(fields, field_name)
    text = fill_template(template, fields)
    if not text.strip():
        raise RowError("empty_text", "prompt template filled to an empty text")
    return text
