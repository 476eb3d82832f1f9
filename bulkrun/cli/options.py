"""Option bundles shared by the job commands, and the decorator that adds them to a command.

Every option defaults to None ("not given"), so a flag overrides a job spec only when it is actually
on the command line. The decorated command receives the given ones as `opts: dict` keyed by spec key:

    @app.command()
    @with_options(JOB_OPTIONS)
    def generate(input: Path, opts: dict): ...
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import typer

from bulkrun.distributed.options import RayOpt, ShardOpt, WorkersOpt


@dataclass(frozen=True)
class Opt:
    key: str  # the spec key (and python parameter name)
    annotation: Any  # a typer Annotated type, or a plain type with `info` as default
    info: Any = None


def opt(key: str, kind: Any, *decls: str, help: str, **kw) -> Opt:
    return Opt(key, kind | None, typer.Option(None, *decls, help=help, show_default=False, **kw))


INPUT_OPTIONS = [
    opt(
        "out", str, "--out", "-o", help="Output directory (default: runs/<task>-<input name>).", metavar="DIR"
    ),
    opt("model", str, "--model", "-m", help="Default alias, local HF model directory, or .gguf file."),
    opt("id_field", str, "--id-field", help="Field holding each row's id (default: the row number)."),
    opt("text_field", str, "--text-field", help="Field holding the text (default: text)."),
    opt("prompt_template", str, "--prompt-template", help="Prompt with {field} placeholders filled per row."),
    opt("system", str, "--system", help="System message added to every chat prompt."),
    opt("messages_field", str, "--messages-field", help="Field of chat messages (default: messages)."),
    opt(
        "chat_template",
        bool,
        "--chat-template/--no-chat-template",
        help="Apply the model's chat template (default: on).",
    ),  # fmt: skip
    opt(
        "keep_fields", list[str], "--keep-field", help="Copy this input field into the results (repeatable)."
    ),
]
SAMPLING_OPTIONS = [
    opt("temperature", float, "--temperature", "-t", help="0 = greedy (default 0)."),
    opt("top_k", int, "--top-k", help="Sample from the k most likely tokens (0 = off)."),
    opt("top_p", float, "--top-p", help="Nucleus sampling mass (1 = off)."),
    opt("min_p", float, "--min-p", help="Drop tokens below min_p x the top probability (0 = off)."),
    opt("max_tokens", int, "--max-tokens", help="Most tokens generated per sample (default 64)."),
    opt("seed", int, "--seed", help="Job seed; each sample's seed derives from (seed, id, sample)."),
    opt("stop", list[str], "--stop", help="Stop string (repeatable)."),
    opt("n", int, "--n", "-n", help="Samples per row (default 1)."),
    opt("max_model_len", int, "--max-model-len", help="Cap the context length (tokens)."),
]
RUN_OPTIONS = [
    opt("window", int, "--window", help="Rows read, tokenized and length-sorted at a time (default 256)."),
    opt("sort_by_length", bool, "--sort/--no-sort", help="Sort each window by prompt length (default: on)."),
    opt(
        "checkpoint_every",
        str,
        "--checkpoint-every",
        help="Commit a shard every N items and/or T seconds: 500, 60s, or 500,60s (default 1000,60s).",
    ),  # fmt: skip
    opt("quiet", bool, "--quiet/--no-quiet", "-q", help="No progress bar or summary."),
    opt("restart", bool, "--restart", help="Discard what OUT holds and start over."),
]
ENGINE_OPTIONS = [
    opt(
        "kv_cache_mem", str, "--kv-cache-mem", help="KV-cache memory, e.g. 2GiB (default: from free memory)."
    ),
    opt("max_batch_tokens", int, "--max-batch-tokens", help="Token budget per engine step."),
    opt("max_seqs", int, "--max-seqs", help="Most sequences running at once."),
    opt(
        "prefix_cache",
        bool,
        "--prefix-cache/--no-prefix-cache",
        help="Reuse shared prompt prefixes (default: on).",
    ),
    opt("kernels", str, "--kernels", help="auto | triton | cpu | reference."),
    opt("device", str, "--device", help="cpu or cuda (default: cuda if available)."),
    opt("dtype", str, "--dtype", help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on CUDA)."),
]
CONSTRAINT_OPTIONS = [
    opt("json_schema", str, "--json-schema", help="JSON Schema every output obeys.", metavar="FILE"),
    opt("regex", str, "--regex", help="Every output matches this regular expression."),
    opt("choice", list[str], "--choice", help="Every output is one of these: a,b,c."),
    opt("schema_field", str, "--schema-field", help="Field holding each row's own JSON Schema."),
]
DIST_OPTIONS = [Opt("ray", RayOpt), Opt("workers", WorkersOpt), Opt("shard", ShardOpt)]

GENERATION_OPTIONS = SAMPLING_OPTIONS + CONSTRAINT_OPTIONS
JOB_OPTIONS = INPUT_OPTIONS + GENERATION_OPTIONS + RUN_OPTIONS + ENGINE_OPTIONS + DIST_OPTIONS


def with_options(*bundles: list[Opt]):
    """Add the bundles' options to a command; it gets the ones given as `opts: dict`."""
    added = [o for bundle in bundles for o in bundle]

    def decorate(fn):
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "opts"]
        extra = [
            inspect.Parameter(
                o.key,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if o.info is None else o.info,  # Annotated options: default None
                annotation=o.annotation,
            )
            for o in added
        ]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            given = {}
            for o in added:
                value = kwargs.pop(o.key, None)
                if value is not None and value != [] and value != ():
                    given[o.key] = list(value) if isinstance(value, tuple) else value
            return fn(*args, **kwargs, opts=given)

        wrapper.__signature__ = sig.replace(parameters=own + extra)
        wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
        return wrapper

    return decorate
