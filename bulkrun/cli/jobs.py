"""Job commands: generate, summarize, and run (a TOML job spec)."""

from __future__ import annotations

import typer

from bulkrun.cli import options as opt
from bulkrun.cli.app import app
from bulkrun.cli.outcome import run_job_command, run_task_command
from bulkrun.job.spec import spec_from_file


@app.command()
def generate(
    ctx: typer.Context,
    input: opt.Input,
    out: opt.Out = None,
    model: opt.Model = None,
    id_field: opt.IdField = None,
    text_field: opt.TextField = None,
    prompt_template: opt.PromptTemplate = None,
    system: opt.System = None,
    messages_field: opt.MessagesField = None,
    chat_template: opt.ChatTemplate = None,
    chat_template_kwargs: opt.ChatTemplateKwargs = None,
    keep_fields: opt.KeepFields = None,
    temperature: opt.Temperature = None,
    top_k: opt.TopK = None,
    top_p: opt.TopP = None,
    min_p: opt.MinP = None,
    max_tokens: opt.MaxTokens = None,
    seed: opt.Seed = None,
    stop: opt.Stop = None,
    n: opt.N = None,
    max_model_len: opt.MaxModelLen = None,
    json_schema: opt.JsonSchema = None,
    regex: opt.Regex = None,
    choice: opt.Choice = None,
    schema_field: opt.SchemaField = None,
    window: opt.Window = None,
    sort_by_length: opt.SortByLength = None,
    checkpoint_every: opt.CheckpointEvery = None,
    quiet: opt.Quiet = None,
    restart: opt.Restart = None,
    kv_cache_bytes: opt.KvCacheBytes = None,
    max_num_batched_tokens: opt.MaxNumBatchedTokens = None,
    max_num_seqs: opt.MaxNumSeqs = None,
    enable_prefix_caching: opt.EnablePrefixCaching = None,
    kernels: opt.Kernels = None,
    device: opt.Device = None,
    dtype: opt.Dtype = None,
    cuda_graphs: opt.CudaGraphs = None,
    batch_invariant: opt.BatchInvariant = None,
    ray: opt.Ray = None,
    ray_address: opt.RayAddress = None,
    workers: opt.Workers = None,
    shard: opt.Shard = None,
) -> int:
    """Generate text for every row (use --n for several samples per row: synthetic data).

    The prompt is the row's --text-field, or --prompt-template filled from its fields. OpenAI batch
    files are detected and answered in OpenAI's output format (output.jsonl, errors.jsonl).
    """
    return run_task_command("generate", opt.spec_values(ctx))


@app.command()
def summarize(
    ctx: typer.Context,
    input: opt.Input,
    out: opt.Out = None,
    model: opt.Model = None,
    id_field: opt.IdField = None,
    text_field: opt.TextField = None,
    prompt_template: opt.PromptTemplate = None,
    system: opt.System = None,
    messages_field: opt.MessagesField = None,
    chat_template: opt.ChatTemplate = None,
    keep_fields: opt.KeepFields = None,
    temperature: opt.Temperature = None,
    top_k: opt.TopK = None,
    top_p: opt.TopP = None,
    min_p: opt.MinP = None,
    max_tokens: opt.MaxTokens = None,
    seed: opt.Seed = None,
    stop: opt.Stop = None,
    n: opt.N = None,
    max_model_len: opt.MaxModelLen = None,
    json_schema: opt.JsonSchema = None,
    regex: opt.Regex = None,
    choice: opt.Choice = None,
    schema_field: opt.SchemaField = None,
    window: opt.Window = None,
    sort_by_length: opt.SortByLength = None,
    checkpoint_every: opt.CheckpointEvery = None,
    quiet: opt.Quiet = None,
    restart: opt.Restart = None,
    kv_cache_bytes: opt.KvCacheBytes = None,
    max_num_batched_tokens: opt.MaxNumBatchedTokens = None,
    max_num_seqs: opt.MaxNumSeqs = None,
    enable_prefix_caching: opt.EnablePrefixCaching = None,
    kernels: opt.Kernels = None,
    device: opt.Device = None,
    dtype: opt.Dtype = None,
    cuda_graphs: opt.CudaGraphs = None,
    batch_invariant: opt.BatchInvariant = None,
    ray: opt.Ray = None,
    ray_address: opt.RayAddress = None,
    workers: opt.Workers = None,
    shard: opt.Shard = None,
    instruction: opt.Instruction = None,
) -> int:
    """Summarize the text of every row (default max tokens 160)."""
    return run_task_command("summarize", opt.spec_values(ctx))


@app.command()
def run(
    ctx: typer.Context,
    spec: opt.SpecFile,
    input: opt.SpecInput = None,
    set: opt.Set = None,
    out: opt.Out = None,
    model: opt.Model = None,
    id_field: opt.IdField = None,
    text_field: opt.TextField = None,
    prompt_template: opt.PromptTemplate = None,
    system: opt.System = None,
    messages_field: opt.MessagesField = None,
    chat_template: opt.ChatTemplate = None,
    keep_fields: opt.KeepFields = None,
    temperature: opt.Temperature = None,
    top_k: opt.TopK = None,
    top_p: opt.TopP = None,
    min_p: opt.MinP = None,
    max_tokens: opt.MaxTokens = None,
    seed: opt.Seed = None,
    stop: opt.Stop = None,
    n: opt.N = None,
    max_model_len: opt.MaxModelLen = None,
    json_schema: opt.JsonSchema = None,
    regex: opt.Regex = None,
    choice: opt.Choice = None,
    schema_field: opt.SchemaField = None,
    window: opt.Window = None,
    sort_by_length: opt.SortByLength = None,
    checkpoint_every: opt.CheckpointEvery = None,
    quiet: opt.Quiet = None,
    restart: opt.Restart = None,
    kv_cache_bytes: opt.KvCacheBytes = None,
    max_num_batched_tokens: opt.MaxNumBatchedTokens = None,
    max_num_seqs: opt.MaxNumSeqs = None,
    enable_prefix_caching: opt.EnablePrefixCaching = None,
    kernels: opt.Kernels = None,
    device: opt.Device = None,
    dtype: opt.Dtype = None,
    cuda_graphs: opt.CudaGraphs = None,
    batch_invariant: opt.BatchInvariant = None,
    ray: opt.Ray = None,
    ray_address: opt.RayAddress = None,
    workers: opt.Workers = None,
    shard: opt.Shard = None,
) -> int:
    """Run a job spec (TOML: task, input, and any option): what a cron line calls.

    Example: bulkrun run jobs/classify-tickets.toml

    Flags given here override the spec's values; a rerun resumes where the last run stopped.
    """
    return run_job_command(spec_from_file(spec, opt.spec_values(ctx, "spec")))
