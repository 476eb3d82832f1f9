"""Embedding: one prompt-only request per row, pooled into one vector (search, clustering, dedup).

The row's text (--text-field / --prompt-template, or an OpenAI /v1/embeddings line's body.input) gets
the instruction prefix (--query-prompt, or a prompt the model's sentence-transformers config names)
and is tokenized as the model's tokenizer does it (special tokens, no chat template). A text longer
than --max-length (default: the model's sentence-transformers max_seq_length, else its context) is
cut as sentence-transformers cuts it, keeping the trailing special tokens, and marked `truncated`;
with --no-truncate it becomes an error record instead.

How tokens become a vector (pooling, normalization) comes from the model directory as
sentence-transformers reads it; --pooling / --normalize set it for a plain Hugging Face directory (or
override it). --dimensions keeps the first N dimensions (Matryoshka models), then normalizes.
Result columns: embedding (float32, or float16 with --embedding-dtype float16), prompt_tokens,
truncated.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from bulkrun.engine.core.outputs import RequestOutput
from bulkrun.engine.core.params import EngineRequest, PoolingParams
from bulkrun.exceptions import UsageError
from bulkrun.io.openai_batch import EMBEDDINGS_URL
from bulkrun.tasks.base import Item, RawText, RowError, Task, TaskContext, prompt_text
from bulkrun.tasks.constraints import is_openai_line

EMBEDDING_DTYPES = {"float32": np.float32, "float16": np.float16}
POOLING_METHODS = ("mean", "cls", "last")


class EmbedTask(Task):
    name = "embed"
    options: ClassVar[dict[str, Any]] = {
        "pooling": None,
        "normalize": None,
        "dimensions": None,
        "max_length": None,
        "truncate": True,
        "embedding_dtype": "float32",
        "query_prompt": None,
        "prompt_name": None,
    }
    # texts are embedded as they are; nothing is generated
    default_overrides: ClassVar[dict[str, Any]] = {"chat_template": False, "max_tokens": 0}
    truncates_prompts: ClassVar[bool] = True
    default_model: ClassVar[str | None] = "all-minilm-l6-v2"

    def __init__(self, pooling=None, normalize=None, dimensions=None, max_length=None, truncate=True,
                 embedding_dtype="float32", query_prompt=None, prompt_name=None):  # fmt: skip
        if pooling is not None and pooling not in POOLING_METHODS:
            raise ValueError(f"--pooling must be one of {', '.join(POOLING_METHODS)}, got {pooling!r}")
        if embedding_dtype not in EMBEDDING_DTYPES:
            raise ValueError(f"--embedding-dtype must be float32 or float16, got {embedding_dtype!r}")
        for name, value in (("dimensions", dimensions), ("max_length", max_length)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        normalize = _normalize_flag(normalize)
        if query_prompt is not None and prompt_name is not None:
            raise ValueError("--query-prompt and --prompt-name are two ways to say the same thing; give one")
        self.pooling, self.normalize, self.dimensions = pooling, normalize, dimensions
        self.max_length, self.truncate = max_length, truncate
        self.dtype = EMBEDDING_DTYPES[embedding_dtype]
        self.query_prompt, self.prompt_name = query_prompt, prompt_name

    def bind(self, ctx: TaskContext) -> None:
        """Settle pooling, length and prefix from the options over the model's own profile."""
        super().bind(ctx)
        profile = ctx.embedding_profile
        method = self.pooling or getattr(profile, "pooling", None)
        if method is None:
            raise UsageError(
                "the model directory does not say how to pool its hidden states (no sentence-transformers "
                "modules.json): pass --pooling mean, cls or last"
            )
        methods = getattr(profile, "pooling_methods", POOLING_METHODS)
        if method not in methods:
            raise UsageError(
                f"--pooling {method}: this model pools {' or '.join(methods)} (a decoder: its last token)"
            )
        normalize = (
            self.normalize if self.normalize is not None else bool(getattr(profile, "normalize", False))
        )
        self.params = PoolingParams(method, normalize, self.dimensions)
        model_max = getattr(profile, "max_length", None) or ctx.max_model_len
        self.limit = min(self.max_length or model_max, ctx.max_model_len)
        if self.max_length is not None and self.max_length > ctx.max_model_len:
            raise UsageError(
                f"--max-length {self.max_length} exceeds the model's {ctx.max_model_len} positions"
            )
        self.prefix = self._prefix(profile)
        self.tail = _special_suffix(ctx.tokenizer)
        self._cut: set[int] = set()  # rows whose text was truncated, until their result is built

    def _prefix(self, profile) -> str:
        if self.query_prompt is not None:
            return self.query_prompt
        prompts = dict(getattr(profile, "prompts", None) or {})
        name = self.prompt_name or getattr(profile, "default_prompt_name", None)
        if name is None:
            return ""
        if name not in prompts:
            known = ", ".join(prompts) or "none"
            raise UsageError(
                f"--prompt-name {name!r}: the model's sentence-transformers config names {known}"
            )
        return prompts[name]

    def render(self, item: Item) -> str:
        fields = item.fields
        if is_openai_line(fields):
            if fields["url"] != EMBEDDINGS_URL:
                raise RowError(
                    "unsupported_endpoint", f"embed answers {EMBEDDINGS_URL} lines, not {fields['url']}"
                )
            text = fields["input"]
        else:
            text = prompt_text(fields, self.ctx.prompt_template, self.ctx.text_field)
        return RawText(self.prefix + text)  # embeddings never take the chat template

    def requests(self, item: Item, prompt_ids: list[int]) -> list[EngineRequest]:
        params = self._row_params(item)
        if len(prompt_ids) > self.limit:
            if not self.truncate:
                raise RowError(
                    "too_long", f"text of {len(prompt_ids)} tokens is longer than --max-length {self.limit}"
                )
            prompt_ids = _truncate(prompt_ids, self.limit, self.tail)
            self._cut.add(item.index)
        return [EngineRequest("0", prompt_ids, pooling=params)]

    def result(self, item: Item, outputs: list[RequestOutput]) -> dict:
        output = outputs[0]
        truncated = item.index in self._cut
        self._cut.discard(item.index)
        vector = np.asarray(output.embedding, dtype=np.float32)
        wanted = self._row_params(item).dimensions
        if wanted is not None and vector.shape[0] < wanted:
            raise RowError("bad_dimensions", f"dimensions {wanted} exceeds the model's {vector.shape[0]}")
        columns = {
            "embedding": vector.astype(self.dtype),
            "prompt_tokens": len(output.prompt_token_ids),
            "truncated": truncated,
        }
        if is_openai_line(item.fields):
            columns["endpoint"] = EMBEDDINGS_URL
            columns["encoding_format"] = item.fields.get("encoding_format", "float")
        return columns

    def _row_params(self, item: Item) -> PoolingParams:
        dimensions = item.fields.get("dimensions") if is_openai_line(item.fields) else None
        if dimensions is None:
            return self.params
        return PoolingParams(self.params.method, self.params.normalize, dimensions)


def _normalize_flag(value) -> bool | None:
    """--normalize l2 | none (the CLI, shared with classify's --normalize) or a spec's true / false."""
    if value is None or isinstance(value, bool):
        return value
    choices = {"l2": True, "none": False, "true": True, "false": False}
    if str(value).lower() not in choices:
        raise ValueError(f"--normalize must be l2 or none for embeddings, got {value!r}")
    return choices[str(value).lower()]


def _truncate(ids: list[int], limit: int, tail: int) -> list[int]:
    """The first tokens up to `limit`, keeping the `tail` special tokens the tokenizer appends (as a
    tokenizer's own truncation does: [CLS] ... [SEP] stays well-formed)."""
    if tail == 0:
        return ids[:limit]
    return ids[: limit - tail] + ids[-tail:]


def _special_suffix(tokenizer) -> int:
    """How many special tokens the tokenizer appends to a text ([SEP], </s>, an EOS)."""
    plain = tokenizer("hello", add_special_tokens=False)["input_ids"]
    full = tokenizer("hello", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return len(full) - start - len(plain)
    return 0
