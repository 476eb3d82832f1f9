"""Option bundles shared by the job commands, as plain click decorator stacks.

A bundle is a list of `opt(...)` lines, one per option: its spec key, its kind, its flags, its help.
Every option defaults to None ("not given"), so a flag overrides a job spec only when it is actually
on the command line. `options(*bundles)` stacks the bundles' click options on a command, which
receives the given ones as `opts: dict` keyed by spec key:

    @app.command()
    @click.argument("input", ...)
    @options(JOB_OPTIONS)
    def generate(input, opts): ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import click

from bulkrun.distributed.options import RAY_DEFAULT, check_ray_address


@dataclass(frozen=True)
class Opt:
    key: str  # the spec key (and the click parameter name)
    decorator: Callable  # the click.option(...) that declares it


def opt(key: str, kind, *decls: str, help: str, **kw) -> Opt:
    """One shared option. kind: str, int, float, bool (a flag, or an --x/--no-x pair), list[str]
    (repeatable), or a click type."""
    if kind is bool:
        kw.setdefault("is_flag", True)
    elif kind == list[str]:
        kind, kw["multiple"] = str, True
    return Opt(key, click.option(*decls, key, type=kind, default=None, help=help, show_default=False, **kw))


INPUT_OPTIONS = [
    opt("out", str, "--out", "-o", help="Output directory (default: runs/<task>-<input name>).", metavar="DIR"),
    opt("model", str, "--model", "-m", help="Default alias, local HF model directory, or .gguf file."),
    opt("id_field", str, "--id-field", help="Field holding each row's id (default: the row number)."),
    opt("text_field", str, "--text-field", help="Field holding the text (default: text)."),
    opt("prompt_template", str, "--prompt-template", help="Prompt with {field} placeholders filled per row."),
    opt("system", str, "--system", help="System message added to every chat prompt."),
    opt("messages_field", str, "--messages-field", help="Field of chat messages (default: messages)."),
    opt("chat_template", bool, "--chat-template/--no-chat-template", help="Apply the model's chat template (default: on)."),
    opt("keep_fields", list[str], "--keep-field", help="Copy this input field into the results (repeatable)."),
]  # fmt: skip
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
]  # fmt: skip
RUN_OPTIONS = [
    opt("window", int, "--window", help="Rows read, tokenized and length-sorted at a time (default 256)."),
    opt("sort_by_length", bool, "--sort/--no-sort", help="Sort each window by prompt length (default: on)."),
    opt("checkpoint_every", str, "--checkpoint-every", help="Commit a shard every N items and/or T seconds: 500, 60s, or 500,60s (default 1000,60s)."),
    opt("quiet", bool, "--quiet/--no-quiet", "-q", help="No progress bar or summary."),
    opt("restart", bool, "--restart", help="Discard what OUT holds and start over."),
]  # fmt: skip
ENGINE_OPTIONS = [
    opt("kv_cache_mem", str, "--kv-cache-mem", help="KV-cache memory, e.g. 2GiB (default: from free memory)."),
    opt("max_batch_tokens", int, "--max-batch-tokens", help="Token budget per engine step."),
    opt("max_seqs", int, "--max-seqs", help="Most sequences running at once."),
    opt("prefix_cache", bool, "--prefix-cache/--no-prefix-cache", help="Reuse shared prompt prefixes (default: on)."),
    opt("kernels", str, "--kernels", help="auto | triton | cpu | reference."),
    opt("device", str, "--device", help="cpu or cuda (default: cuda if available)."),
    opt("dtype", str, "--dtype", help="float32 / bfloat16 / float16 (default: bf16 on CUDA; on a CPU bf16 where it has native bf16, else fp32)."),
    opt("cuda_graphs", bool, "--cuda-graphs/--no-cuda-graphs", help="Replay captured CUDA graphs for decode-only steps (default: on; CUDA only)."),
    opt("batch_invariant", bool, "--batch-invariant/--no-batch-invariant", help="A row's tokens and log-probabilities do not depend on its batch mates, prompt chunking or cache hits (default: on; off may be faster)."),
]  # fmt: skip

DIST_OPTIONS = [
    opt("ray", str, "--ray", metavar="[ADDRESS]", is_flag=False, flag_value=RAY_DEFAULT, callback=lambda ctx, param, value: check_ray_address(value) or value, help="Run on Ray: one engine per worker (one GPU each where there are GPUs). A bare --ray joins the running cluster (RAY_ADDRESS or `ray start`) or starts a local one; ADDRESS may be 'auto', 'local', host:port or ray://host:10001. Needs: pip install 'bulkrun[ray]'."),
    opt("workers", click.IntRange(min=1), "--workers", help="With --ray: number of workers (engines). Default: one per GPU of the cluster, else 1."),
    opt("shard", str, "--shard", metavar="K/N", help="Job arrays: process only slice K of N (0-based: 0/N .. N-1/N; rows whose index % N == K). All slices share one --out; `bulkrun export OUT` merges them once all are done."),
]  # fmt: skip
# fmt: off
CALIBRATE_OPTIONS = [
    opt("calibrate", str, "--calibrate", help="content-free (default: divide by the prompt's label prior) or none."),
]
MULTIPLE_CHOICE_OPTIONS = [
    opt("choices_field", str, "--choices-field", help="Multiple choice: the list field of each row's choices."),
    opt("context_field", str, "--context-field", help="Multiple choice: the context field (else the template/text field)."),
    opt("target_delimiter", str, "--target-delimiter", help="Multiple choice: text between context and choice (default ' ')."),
]
CONSTRAINT_OPTIONS = [
    opt("json_schema", str, "--json-schema", help="JSON Schema every output obeys.", metavar="FILE"),
    opt("regex", str, "--regex", help="Every output matches this regular expression."),
    opt("choice", list[str], "--choice", help="Every output is one of these: a,b,c."),
    opt("schema_field", str, "--schema-field", help="Field holding each row's own JSON Schema."),
]
# fmt: on

GENERATION_OPTIONS = SAMPLING_OPTIONS + CONSTRAINT_OPTIONS
JOB_OPTIONS = INPUT_OPTIONS + GENERATION_OPTIONS + RUN_OPTIONS + ENGINE_OPTIONS + DIST_OPTIONS


def options(*bundles: list[Opt]):
    """Stack the bundles' click options on a command; it gets the ones given as `opts: dict`."""
    added = [o for bundle in bundles for o in bundle]

    def decorate(fn):
        @functools.wraps(fn)
        def command(*args, **kwargs):
            given = {}
            for o in added:
                value = kwargs.pop(o.key, None)
                if value is not None and value != ():
                    given[o.key] = list(value) if isinstance(value, tuple) else value
            return fn(*args, **kwargs, opts=given)

        for o in reversed(added):  # click lists options in the order written here
            command = o.decorator(command)
        return command

    return decorate
