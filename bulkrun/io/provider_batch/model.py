"""The plain values that cross the provider-batch boundary: requests going out, outcomes coming back."""

from __future__ import annotations

from dataclasses import dataclass

from bulkrun.exceptions import InputError, UsageError


class UnsupportedOption(UsageError):
    """A job option the provider cannot honour (e.g. top_k on OpenAI): refused before any file is written."""


class ExportExists(UsageError):
    """The export directory already holds an export (its results may still be on their way)."""


class ProviderBatchError(InputError):
    """A result or id-map file that cannot be read: broken JSON, a missing field, an unknown custom_id."""


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """A structured-output constraint a provider can enforce itself."""

    kind: str  # "json_schema" | "json_object"
    schema: dict | None = None  # the JSON schema (kind "json_schema")
    name: str = "output"  # OpenAI wants a name for the schema
    strict: bool = True

    def __post_init__(self):
        if self.kind not in ("json_schema", "json_object"):
            raise ValueError(f"response format kind must be json_schema or json_object, got {self.kind!r}")
        if self.kind == "json_schema" and not isinstance(self.schema, dict):
            raise ValueError("a json_schema response format needs the schema as an object")


@dataclass(frozen=True, slots=True)
class BatchSampling:
    """The job's sampling options, in the job's own terms (0 / 1.0 mean "off", as in SamplingParams)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    response_format: ResponseFormat | None = None


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One row of the job as chat messages ({"role", "content": str}), system messages included."""

    row: int
    id: str
    messages: list[dict]
    sampling: BatchSampling | None = None  # None: the export's sampling (OpenAI-batch input rows differ)


@dataclass(slots=True)
class SampleResult:
    """One finished sample of one row, in the job's terms."""

    row: int
    id: str
    sample: int
    text: str
    finish_reason: str  # "stop" | "length" | the provider's own reason (e.g. "content_filter")
    prompt_tokens: int | None  # as the provider counted them (its tokenizer, not the job's)
    generated_tokens: int | None  # None where the provider reports one total for several samples


@dataclass(slots=True)
class BatchError:
    """A request that came back (or could not go out) without a result.

    `retryable` errors (expired, canceled, timeouts, overload) are not the row's fault: the job layer
    leaves such rows undone so a plain rerun finishes them, instead of committing an error record."""

    row: int
    id: str
    kind: str
    message: str
    sample: int = 0
    retryable: bool = False

    def record(self) -> dict:
        """The job's error record (bulkrun.io.shards.ERROR_COLUMNS)."""
        return {"row": self.row, "id": self.id, "kind": self.kind, "message": self.message}


class RowRefused(Exception):
    """A row the provider's request format cannot express (e.g. a tool message); becomes an error record."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(slots=True)
class ParsedLine:
    """One line of a provider's result file, before its custom_id is resolved to a row."""

    custom_id: str
    choices: list[tuple[int, str, str, int | None]]  # (sample index, text, finish_reason, generated tokens)
    prompt_tokens: int | None = None
    error: tuple[str, str, bool] | None = None  # (kind, message, retryable)
