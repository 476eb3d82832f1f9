"""Constrained decoding, the bookkeeping side: what a request is constrained to, compiled grammars,
and each request's matcher state. No torch here (masks are numpy int32 rows; grammar_mask.py applies
them to logits).

The grammar engine is llguidance, chosen over xgrammar by bench/constraint_bench.py (figures in
docs/benchmarks.md): it compiles per-row schemas faster, enforces what it compiles exactly where
xgrammar relaxes a oneOf to anyOf, and needs no torch (xgrammar's matcher imports it).

Flow: a ConstraintSpec is compiled once per (spec, tokenizer) by a GrammarCache, under a time limit;
each request gets a fresh GrammarMatcher from it. Per step: fill the constrained rows' masks
(MaskFiller.fill, one call for the batch), apply them to the logits, sample, then `accept` the sampled
token. When the grammar is complete the mask allows only EOS, so a constrained request ends by
itself; one cut by max_tokens is reported by grammar_output.check_output, never patched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import llguidance

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice"]
# No whitespace outside strings and compact separators: a model cannot loop on spaces or newlines
# until max_tokens, and records cost fewer tokens. A schema's own "x-guidance" options may override.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
DEFAULT_TIME_LIMIT_S = 10.0


class GrammarError(ValueError):
    """A constraint that cannot be used: malformed, unsupported, or too slow to compile."""


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """What one request's output must be. `value` is canonical text, so equal constraints are equal
    specs (and share one compiled grammar): compact JSON for a schema (keys keep their order: the
    output's properties follow the schema's order), the pattern for a regex, a JSON list for choices."""

    kind: ConstraintKind
    value: str

    @classmethod
    def json_schema(cls, schema: dict | str) -> ConstraintSpec:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        import jsonschema  # here, not at the top: a job without constraints never loads it

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise GrammarError(f"invalid JSON schema at {_path(e.absolute_path)}: {e.message}") from None
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))

    @classmethod
    def json_object(cls) -> ConstraintSpec:
        return cls("json_object", "")

    @classmethod
    def regex(cls, pattern: str) -> ConstraintSpec:
        if not pattern:
            raise GrammarError("the regex is empty")
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: list[str] | tuple[str, ...]) -> ConstraintSpec:
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise GrammarError(f"choices must be a non-empty list of non-empty strings, got {choices!r}")
        return cls("choice", json.dumps(list(dict.fromkeys(choices))))

    @property
    def schema(self) -> dict | None:
        """The JSON schema the output must satisfy (json_object: any object); None for regex/choice."""
        if self.kind == "json_schema":
            return json.loads(self.value)
        return {"type": "object"} if self.kind == "json_object" else None

    @property
    def choices(self) -> list[str]:
        return json.loads(self.value) if self.kind == "choice" else []

    def grammar_text(self) -> str:
        """The llguidance grammar for this spec (no tokenizer needed)."""
        import llguidance

        m = llguidance.LLMatcher
        if self.kind == "regex":
            return m.grammar_from_regex(self.value)
        if self.kind == "choice":
            return m.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in self.choices))
        return m.grammar_from_json_schema(json.dumps(closed_objects(self.schema)), defaults=JSON_OPTIONS)


# Keywords whose values are data, not subschemas: never rewritten.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "required"})
_OPENNESS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# Keywords whose values map names to subschemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def closed_objects(schema):
    """The schema generation follows: an object schema that lists `properties` and says nothing of
    other keys gets `additionalProperties: false`. JSON Schema leaves such objects open, and a small
    model then keeps inventing keys until max_tokens; like OpenAI's strict mode, bulkrun generates
    only the listed keys unless the schema opens the object itself (`"additionalProperties": true`
    or a schema). The output is still validated against the schema as written."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed_objects(sub) for name, sub in value.items()}
        else:
            out[key] = value if key in _DATA_KEYWORDS else closed_objects(value)
    if isinstance(out.get("properties"), dict) and not any(k in out for k in _OPENNESS):
        out["additionalProperties"] = False
    return out


def _path(parts) -> str:
    return "/" + "/".join(str(p) for p in parts)


_PREPARED: dict[tuple, GrammarTokenizer] = {}
_PREPARED_LOCK = threading.Lock()


class GrammarTokenizer:
    """The model's tokenizer as the grammar engine sees it, with a fingerprint for cache keys.
    Preparing it costs about a second (it walks the whole vocabulary): make one per model."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]):
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        import llguidance

        self.ll = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=self.eos_token_ids)
        digest = hashlib.sha256(tokenizer_json.encode())
        digest.update(json.dumps([vocab_size, self.eos_token_ids]).encode())
        self.fingerprint = digest.hexdigest()[:16]

    @classmethod
    def from_model_dir(
        cls, model_dir: str | Path, vocab_size: int, eos_token_ids: list[int]
    ) -> GrammarTokenizer:
        return cls((Path(model_dir) / "tokenizer.json").read_text(), vocab_size, eos_token_ids)

    @classmethod
    def from_hf(cls, tokenizer, vocab_size: int, eos_token_ids: list[int]) -> GrammarTokenizer:
        """From a transformers fast tokenizer (its serialized backend, added tokens included). One
        per tokenizer and process: engines over the same model share it."""
        tokenizer_json = tokenizer.backend_tokenizer.to_str()
        key = (hashlib.sha256(tokenizer_json.encode()).hexdigest(), vocab_size, tuple(eos_token_ids))
        with _PREPARED_LOCK:
            if key not in _PREPARED:
                _PREPARED[key] = cls(tokenizer_json, vocab_size, eos_token_ids)
            return _PREPARED[key]

    @property
    def mask_words(self) -> int:
        return (self.vocab_size + 31) // 32


class CompiledGrammar:
    """One spec compiled for one tokenizer: a matcher in the start state, copied for each request."""

    def __init__(self, spec: ConstraintSpec, tokenizer: GrammarTokenizer, start: llguidance.LLMatcher):
        self.spec, self.tokenizer, self._start = spec, tokenizer, start

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self.spec, self._start.deep_copy(), self.tokenizer.eos_token_ids)


class GrammarMatcher:
    """One request's position in its grammar."""

    __slots__ = ("spec", "ll", "num_accepted", "_eos")

    def __init__(self, spec: ConstraintSpec, ll: llguidance.LLMatcher, eos_token_ids: list[int]):
        self.spec, self.ll, self.num_accepted, self._eos = spec, ll, 0, frozenset(eos_token_ids)

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (without consuming it): how a shortcut token is screened."""
        if token in self._eos:  # validate_tokens never counts EOS; the mask allows it once complete
            return self.ll.is_accepting()
        return self.ll.validate_tokens([token]) == 1

    def accept(self, token: int) -> bool:
        """Advance by a sampled token. False: the token broke the grammar (the matcher is then in its
        error state for good; with the mask applied this never happens)."""
        ok = self.ll.consume_token(token)
        self.num_accepted += ok
        return ok

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last `num_tokens` accepted tokens (a speculatively advanced step that was dropped)."""
        if num_tokens > self.num_accepted or not self.ll.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} of {self.num_accepted} tokens: {self.error}")
        self.num_accepted -= num_tokens

    @property
    def is_accepting(self) -> bool:
        """The output so far is complete (EOS is allowed now)."""
        return self.ll.is_accepting()

    @property
    def is_finished(self) -> bool:
        """Nothing but EOS can follow (the grammar is complete and cannot grow, or it failed)."""
        return self.ll.is_stopped()

    @property
    def error(self) -> str | None:
        return self.ll.get_error() if self.ll.is_error() else None


def new_bitmask(rows: int, tokenizer: GrammarTokenizer) -> np.ndarray:
    """A packed mask buffer: one int32 row of ceil(V/32) words per constrained request."""
    return np.full((rows, tokenizer.mask_words), -1, dtype=np.int32)


class MaskFiller:
    """Fills many requests' masks in one call, on llguidance's own thread pool, GIL released: the
    batch does not serialize on Python, and the caller's thread is free only after all rows are done
    (so run it on a side thread to overlap the model's forward)."""

    def __init__(self, num_threads: int | None = None):
        import llguidance

        self._executor = llguidance.LLExecutor(num_threads)

    def fill(self, matchers: list[GrammarMatcher], bitmask: np.ndarray) -> None:
        """Row i of `bitmask` <- the allowed tokens of matchers[i]."""
        self._check(matchers, bitmask)
        if matchers:
            pairs = [(m.ll, i) for i, m in enumerate(matchers)]
            self._executor.unsafe_compute_mask_ptr(
                pairs, bitmask.ctypes.data, bitmask.shape[1] * 4, bitmask.shape[0]
            )

    @staticmethod
    def _check(matchers: list[GrammarMatcher], bitmask: np.ndarray) -> None:
        if bitmask.dtype != np.int32 or bitmask.ndim != 2 or not bitmask.flags["C_CONTIGUOUS"]:
            raise ValueError("bitmask must be a C-contiguous 2-D int32 array")
        if len(matchers) > bitmask.shape[0]:
            raise ValueError(f"{len(matchers)} matchers for a bitmask of {bitmask.shape[0]} rows")

    def fill_here(self, matchers: list[GrammarMatcher], bitmask: np.ndarray) -> None:
        """fill() on the calling thread alone: on the CPU, where a thread pool's workers (which
        spin a while after each batch) would take cores from the model's forward."""
        self._check(matchers, bitmask)
        row_bytes = bitmask.shape[1] * 4
        for i, m in enumerate(matchers):
            m.ll.unsafe_compute_mask_ptr(bitmask.ctypes.data + i * row_bytes, row_bytes)

    def accept(self, matchers: list[GrammarMatcher], tokens: list[int]) -> list[bool]:
        """Advance every matcher by its token, in parallel."""
        ok = self._executor.consume_token_par([(m.ll, t) for m, t in zip(matchers, tokens, strict=True)])
        for m, good in zip(matchers, ok, strict=True):
            m.num_accepted += good
        return ok


class GrammarCache:
    """Compiles specs for one tokenizer, each at most once: cached by (spec, tokenizer fingerprint),
    failures included (a bad per-row schema repeated over a million rows is compiled once). A compile
    that runs past `time_limit_s` is a GrammarError; it finishes in the background and is dropped."""

    def __init__(
        self, tokenizer: GrammarTokenizer, time_limit_s: float = DEFAULT_TIME_LIMIT_S, max_entries: int = 512
    ):
        self.tokenizer, self.time_limit_s, self.max_entries = tokenizer, time_limit_s, max_entries
        self._entries: OrderedDict[tuple[ConstraintSpec, str], CompiledGrammar | GrammarError] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar-compile")
        self.hits = self.misses = 0

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        key = (spec, self.tokenizer.fingerprint)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self.hits += 1
                self._entries.move_to_end(key)
        if entry is None:
            self.misses += 1
            entry = self._compile_timed(spec)
            with self._lock:
                self._entries[key] = entry
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        if isinstance(entry, GrammarError):
            raise entry
        return entry

    def matcher(self, spec: ConstraintSpec) -> GrammarMatcher:
        return self.compile(spec).matcher()

    def _compile_timed(self, spec: ConstraintSpec) -> CompiledGrammar | GrammarError:
        future = self._pool.submit(_compile, spec, self.tokenizer)
        try:
            return future.result(timeout=self.time_limit_s)
        except FutureTimeout:
            return GrammarError(f"{spec.kind} constraint took over {self.time_limit_s:g}s to compile")
        except GrammarError as e:
            return e


def _compile(spec: ConstraintSpec, tokenizer: GrammarTokenizer) -> CompiledGrammar:
    """Build the start-state matcher and its first mask: llguidance builds its lexer lazily, so the
    first mask is part of the compile cost, and an unsupported feature surfaces here, not mid-batch."""
    try:
        text = spec.grammar_text()
    except ValueError as e:
        raise GrammarError(f"{spec.kind} constraint: {e}") from None
    import llguidance

    start = llguidance.LLMatcher(tokenizer.ll, text, log_level=0)
    if not start.is_error():
        start.compute_bitmask()
    if start.is_error():
        raise GrammarError(f"{spec.kind} constraint cannot be compiled: {_first_line(start.get_error())}")
    return CompiledGrammar(spec, tokenizer, start)


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "unknown error"
