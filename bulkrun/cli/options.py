"""Every option of the `bulkrun` commands, declared once, as a typed alias a command's signature reuses:

    @app.command()
    def generate(ctx: typer.Context, input: Input, out: Out = None, model: Model = None, ...) -> int:
        return run_task_command("generate", spec_values(ctx))

A parameter's name is its job-spec key (bulkrun/job/spec.py). Every option defaults to None ("not
given"), so a flag overrides a job spec only when it is actually on the command line;
`spec_values(ctx)` hands the given ones on, keyed by spec key. tests/cli/test_cli_help.py checks that
no option is declared twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bulkrun.distributed.options import RAY_DEFAULT, check_ray_address
from bulkrun.exceptions import UsageError
from bulkrun.job.spec import normalize_key


def _option(*decls: str, help: str, **kw) -> typer.models.OptionInfo:
    return typer.Option(*decls, help=help, show_default=False, **kw)


def _ray_address(value: str | None) -> str | None:
    check_ray_address(value)  # a bad address stops before any work
    return value


# ---- positional arguments ---------------------------------------------------------------------
Input = Annotated[Path, typer.Argument(metavar="INPUT", show_default=False, help="The input file.")]
Source = Annotated[
    Path,
    typer.Argument(
        metavar="INPUT|SPEC", show_default=False, help="An input file (with --task), or a TOML job spec."
    ),
]
SpecFile = Annotated[Path, typer.Argument(metavar="SPEC", show_default=False, help="A TOML job spec.")]
OutDir = Annotated[str, typer.Argument(metavar="OUT", show_default=False, help="The job's --out: a path or a URI.")]  # fmt: skip

# ---- rows and prompts -------------------------------------------------------------------------
# fmt: off
Out = Annotated[str | None, _option("--out", "-o", metavar="DIR", help="Output directory (default: runs/<task>-<input name>).")]
Model = Annotated[str | None, _option("--model", "-m", metavar="MODEL", help="Default alias, local HF model directory, or .gguf file.")]
IdField = Annotated[str | None, _option("--id-field", metavar="FIELD", help="Field holding each row's id (default: an id column, else the row number).")]
TextField = Annotated[str | None, _option("--text-field", metavar="FIELD", help="Field holding the text (default: text).")]
PromptTemplate = Annotated[str | None, _option("--prompt-template", metavar="TEXT", help="Prompt with {field} placeholders filled per row.")]
System = Annotated[str | None, _option("--system", metavar="TEXT", help="System message added to every chat prompt.")]
MessagesField = Annotated[str | None, _option("--messages-field", metavar="FIELD", help="Field of chat messages (default: messages).")]
ChatTemplate = Annotated[bool | None, _option("--chat-template/--no-chat-template", help="Apply the model's chat template (default: on).")]
ChatTemplateKwargs = Annotated[str | None, _option("--chat-template-kwargs", metavar="JSON", help='Options for the chat template, a JSON object, e.g. \'{"enable_thinking": false}\'.')]
KeepFields = Annotated[list[str] | None, _option("--keep-field", metavar="FIELD", help="Copy this input field into the results (repeatable).")]

# ---- sampling ---------------------------------------------------------------------------------
Temperature = Annotated[float | None, _option("--temperature", "-t", metavar="T", help="0 = greedy (default 0).")]
TopK = Annotated[int | None, _option("--top-k", metavar="K", help="Sample from the k most likely tokens (0 = off).")]
TopP = Annotated[float | None, _option("--top-p", metavar="P", help="Nucleus sampling mass (1 = off).")]
MinP = Annotated[float | None, _option("--min-p", metavar="P", help="Drop tokens below min_p x the top probability (0 = off).")]
MaxTokens = Annotated[int | None, _option("--max-tokens", metavar="N", help="Most tokens generated per sample (default 64).")]
Seed = Annotated[int | None, _option("--seed", metavar="N", help="Job seed; each sample's seed derives from (seed, id, sample).")]
Stop = Annotated[list[str] | None, _option("--stop", metavar="TEXT", help="Stop string (repeatable).")]
N = Annotated[int | None, _option("--n", "-n", metavar="N", help="Samples per row (default 1).")]
MaxModelLen = Annotated[int | None, _option("--max-model-len", metavar="N", help="Cap the context length (tokens).")]

# ---- constrained generation -------------------------------------------------------------------
JsonSchema = Annotated[str | None, _option("--json-schema", metavar="FILE", help="JSON Schema every output obeys.")]
Regex = Annotated[str | None, _option("--regex", metavar="REGEX", help="Every output matches this regular expression.")]
Choice = Annotated[list[str] | None, _option("--choice", metavar="TEXT", help="Every output is one of these: a,b,c.")]
SchemaField = Annotated[str | None, _option("--schema-field", metavar="FIELD", help="Field holding each row's own JSON Schema.")]

# ---- job mechanics ----------------------------------------------------------------------------
Window = Annotated[int | None, _option("--window", metavar="N", help="Rows read, tokenized and length-sorted at a time (default 256).")]
SortByLength = Annotated[bool | None, _option("--sort/--no-sort", help="Sort each window by prompt length (default: on).")]
CheckpointEvery = Annotated[str | None, _option("--checkpoint-every", metavar="EVERY", help="Commit a shard every N items and/or T seconds: 500, 60s, or 500,60s (default 1000,60s).")]
Quiet = Annotated[bool | None, _option("--quiet/--no-quiet", "-q", help="No progress bar or summary.")]
Restart = Annotated[bool | None, _option("--restart", help="Discard what OUT holds and start over.")]

# ---- engine (the names of bulkrun.engine.config.EngineConfig) ---------------------------------
KvCacheBytes = Annotated[str | None, _option("--kv-cache-bytes", metavar="SIZE", help="KV-cache memory, e.g. 2GiB (default: from free memory).")]
MaxNumBatchedTokens = Annotated[int | None, _option("--max-num-batched-tokens", metavar="N", help="Token budget per engine step.")]
MaxNumSeqs = Annotated[int | None, _option("--max-num-seqs", metavar="N", help="Most sequences running at once.")]
EnablePrefixCaching = Annotated[bool | None, _option("--enable-prefix-caching/--no-enable-prefix-caching", help="Reuse shared prompt prefixes (default: on).")]
Kernels = Annotated[str | None, _option("--kernels", metavar="NAME", help="auto | triton | cpu | reference.")]
Device = Annotated[str | None, _option("--device", metavar="DEVICE", help="cpu or cuda (default: cuda if available).")]
Dtype = Annotated[str | None, _option("--dtype", metavar="DTYPE", help="float32 / bfloat16 / float16 (default: bf16 on CUDA; on a CPU bf16 where it has native bf16, else fp32).")]
CudaGraphs = Annotated[bool | None, _option("--cuda-graphs/--no-cuda-graphs", help="Replay captured CUDA graphs for decode-only steps (default: on; CUDA only).")]
BatchInvariant = Annotated[bool | None, _option("--batch-invariant/--no-batch-invariant", help="A row's tokens and log-probabilities do not depend on its batch mates, prompt chunking or cache hits (default: on; off may be faster).")]

# ---- spreading a job (bulkrun.distributed) ----------------------------------------------------
Ray = Annotated[bool | None, _option("--ray", help="Run on Ray: one engine per worker (one GPU each where there are GPUs); joins the running cluster (RAY_ADDRESS or `ray start`) or starts a local one. Needs: pip install 'bulkrun[ray]'.")]
RayAddress = Annotated[str | None, _option("--ray-address", metavar="ADDRESS", callback=_ray_address, help="Run on the Ray cluster at ADDRESS: 'auto' (an existing one only), 'local' (always a new one), host:port or ray://host:10001.")]
Workers = Annotated[int | None, _option("--workers", metavar="N", min=1, help="With --ray: number of workers (engines). Default: one per GPU of the cluster, else 1.")]
Shard = Annotated[str | None, _option("--shard", metavar="K/N", help="Job arrays: process only slice K of N (0-based: 0/N .. N-1/N; rows whose index % N == K). All slices share one --out; `bulkrun export OUT` merges them once all are done.")]

# ---- labels, calibration, multiple choice (classify, eval) ------------------------------------
Labels = Annotated[str | None, _option("--labels", "-l", metavar="LABELS", help="Labels: a comma list (billing,bug,feature) or a file with one label per line, optionally 'label: description'.")]
LabelsFile = Annotated[str | None, _option("--labels-file", metavar="FILE", help="File with one label per line ('label: description' allowed).")]
Instruction = Annotated[str | None, _option("--instruction", metavar="TEXT", help="Instruction placed before every item (classify: its first line).")]
Normalize = Annotated[str | None, _option("--normalize", metavar="HOW", help="classify: a label's score is the sum of its token log-probabilities (sum, default) or their mean (mean). embed: unit-length vectors (l2) or as pooled (none); default: as the model's config says, none for a plain HF directory.")]
AnswerPrefix = Annotated[str | None, _option("--answer-prefix", metavar="TEXT", help="Text that begins the answer before the label is scored (default 'Label:'; '' for none).")]
Calibrate = Annotated[str | None, _option("--calibrate", metavar="HOW", help="content-free (default: divide by the prompt's label prior) or none.")]
ChoicesField = Annotated[str | None, _option("--choices-field", metavar="FIELD", help="Multiple choice: the list field of each row's choices.")]
ContextField = Annotated[str | None, _option("--context-field", metavar="FIELD", help="Multiple choice: the context field (else the template/text field).")]
TargetDelimiter = Annotated[str | None, _option("--target-delimiter", metavar="TEXT", help="Multiple choice: text between context and choice (default ' ').")]

# ---- embed -------------------------------------------------------------------------------------
Pooling = Annotated[str | None, _option("--pooling", metavar="HOW", help="mean | cls | last (default: the model's sentence-transformers config; needed for a plain HF directory).")]
Dimensions = Annotated[int | None, _option("--dimensions", metavar="N", help="Keep the first N dimensions, then normalize (Matryoshka models).")]
MaxLength = Annotated[int | None, _option("--max-length", metavar="N", help="Longest text in tokens (default: the model's max_seq_length, else its context).")]
Truncate = Annotated[bool | None, _option("--truncate/--no-truncate", help="Cut longer texts at --max-length and mark them truncated (default), or make them error records.")]
EmbeddingDtype = Annotated[str | None, _option("--embedding-dtype", metavar="DTYPE", help="float32 (default) or float16 (half the storage).")]
QueryPrompt = Annotated[str | None, _option("--query-prompt", metavar="TEXT", help="Instruction prefix put before every text (e.g. 'query: ').")]
PromptName = Annotated[str | None, _option("--prompt-name", metavar="NAME", help="A prompt named in the model's config_sentence_transformers.json (e.g. query).")]

# ---- eval and its sweeps ----------------------------------------------------------------------
ExpectedField = Annotated[str | None, _option("--expected-field", metavar="FIELD", help="Field with the expected answer (default: label with --labels, else answer).")]
AnswerRegex = Annotated[str | None, _option("--answer-regex", metavar="REGEX", help="Generation suites: the answer is this regex's first group (or whole match).")]
Match = Annotated[str | None, _option("--match", metavar="HOW", help="Generation suites: exact (default) or normalized (whitespace, case).")]
SweepModel = Annotated[list[str] | None, _option("--sweep-model", metavar="MODEL", help="Sweep: a model per run (repeatable, or a,b).")]
SweepTemplate = Annotated[list[str] | None, _option("--sweep-template", metavar="TEXT", help="Sweep: a prompt template per run (repeatable; @file reads a file).")]
SweepTemperature = Annotated[list[str] | None, _option("--sweep-temperature", metavar="T", help="Sweep: a temperature per run (repeatable, or 0,0.7).")]

# ---- summarize, run, and the commands that look at a job without running it -------------------
SpecInput = Annotated[str | None, _option("--input", "-i", metavar="INPUT", help="Input file (overrides the spec's).")]
Task = Annotated[str | None, _option("--task", metavar="TASK", help="The job's task when INPUT|SPEC is an input file (default: generate).")]
Set = Annotated[list[str] | None, _option("--set", metavar="KEY=VALUE", help="Set any spec key, e.g. a task option: --set labels=[...] (repeatable; wins over the spec).")]

# ---- the commands' own options (not spec keys) ------------------------------------------------
AsJson = Annotated[bool, _option("--json", help="Print JSON instead of text.")]
Format = Annotated[str | None, _option("--format", "-f", metavar="FORMAT", help="results as jsonl or parquet (default: like the input).")]
Force = Annotated[bool, _option("--force", help="Export what is committed even if rows remain.")]
Prices = Annotated[Path | None, _option("--prices", metavar="FILE", help="Provider batch price table (TOML; see README).")]
Sample = Annotated[int | None, _option("--sample", metavar="N", help="Rows run on the engine to measure it (default 32).")]
NoSample = Annotated[bool, _option("--no-sample", help="Run nothing: token counts and bounds only.")]
Provider = Annotated[str, _option("--provider", metavar="PROVIDER", help="openai or anthropic.")]
ProviderModel = Annotated[str, _option("--provider-model", metavar="NAME", help="The provider's model name written into every request.")]
Overwrite = Annotated[bool, _option("--overwrite", help="Replace earlier batch files in OUT/batch.")]
BatchDir = Annotated[Path | None, _option("--batch-dir", metavar="DIR", help="The files `batch prepare` wrote (default: OUT/batch).")]
ResultFiles = Annotated[list[Path], typer.Argument(metavar="RESULT_FILE...", show_default=False, help="The provider's result files.")]
# fmt: on


def spec_values(ctx: typer.Context, *own: str) -> dict:
    """The spec keys the command line gives: every parameter of the command that has a value, keyed
    by its name, less the command's own parameters `own` (e.g. --json). `--ray`/`--ray-address`
    become the spec's `ray`; `--set key=value` pairs become their keys."""
    values = {}
    for name, value in ctx.params.items():
        if name in own or value is None or (isinstance(value, list | tuple) and not value):
            continue
        values[name] = (
            str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value
        )
    address = values.pop("ray_address", None)
    if values.pop("ray", False) or address is not None:
        values["ray"] = address or RAY_DEFAULT
    values.update(parse_sets(values.pop("set", [])))
    return values


def parse_sets(items: list[str]) -> dict:
    """`key=value` pairs; the value is read as a TOML value when it is one (numbers, lists,
    true/false, quoted strings), else taken as a plain string."""
    import tomllib

    values = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects key=value, got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        values[normalize_key(key.strip())] = value
    return values
