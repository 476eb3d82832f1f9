"""`bulkrun plan`: what a job will take (rows, tokens, time, memory, provider cost) before it runs."""

from __future__ import annotations

import json

import typer

from bulkrun.cli import options as opt
from bulkrun.cli.app import app
from bulkrun.cli.job_source import job_spec
from bulkrun.exceptions import EXIT_OK, UsageError

OWN = ("source", "prices", "sample", "no_sample", "as_json")  # plan's own options, not spec keys


@app.command()
def plan(
    ctx: typer.Context,
    source: opt.Source,
    task: opt.Task = None,
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
    prices: opt.Prices = None,
    sample: opt.Sample = None,
    no_sample: opt.NoSample = False,
    as_json: opt.AsJson = False,
) -> int:
    """Estimate a job without running it: rows and bad rows, prompt tokens, shared prefix, generated
    tokens, wall time on this machine (from a short sample run), KV memory, and provider batch cost.

    Takes the same options as the job: `bulkrun plan tickets.jsonl --max-tokens 128 --prices p.toml`.
    Nothing is written to the output directory.
    """
    from bulkrun.job.plan import DEFAULT_SAMPLE, plan_job
    from bulkrun.job.plan_estimate import format_plan

    if no_sample and sample:
        raise UsageError("--sample and --no-sample contradict each other")
    if sample is not None and sample < 1:
        raise UsageError(f"--sample must be >= 1, got {sample}")
    spec = job_spec(source, opt.spec_values(ctx, *OWN))
    estimate = plan_job(spec, sample=0 if no_sample else sample or DEFAULT_SAMPLE, prices=prices)
    print(json.dumps(estimate.as_dict(), indent=2) if as_json else format_plan(estimate))
    return EXIT_OK
