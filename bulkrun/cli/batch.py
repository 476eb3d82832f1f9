"""`bulkrun batch prepare` and `bulkrun batch collect`: a job through a provider's batch tier and back.

`prepare` writes the job's requests as the provider's batch files; `collect` commits the provider's
results as the job's shards. (`bulkrun export` is another thing: it merges a job's shards into its
final files.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from bulkrun.cli import options as opt
from bulkrun.cli.app import PLAIN
from bulkrun.cli.app import app as bulkrun_app
from bulkrun.cli.job_source import job_spec
from bulkrun.exceptions import EXIT_INCOMPLETE, EXIT_OK, EXIT_ROW_ERRORS, UsageError

PROVIDERS = ("openai", "anthropic")
OWN = ("source", "provider", "provider_model", "overwrite")  # prepare's own options, not spec keys

app = typer.Typer(**PLAIN)
bulkrun_app.add_typer(
    app, name="batch", help="A job through a provider's batch tier (OpenAI, Anthropic) and back."
)


@app.command()
def prepare(
    ctx: typer.Context,
    source: opt.Source,
    provider: opt.Provider,
    provider_model: opt.ProviderModel,
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
    overwrite: opt.Overwrite = False,
) -> int:
    """Write the job's requests as provider batch files in OUT/batch/ (OpenAI Batch JSONL or Anthropic
    Message Batches requests), split at the provider's limits; bad rows become the job's error records.

    Upload the files, then bring the results back with `bulkrun batch collect OUT RESULT_FILE...`.
    """
    from bulkrun.job.batch_export import export_batch

    if provider not in PROVIDERS:
        raise UsageError(f"--provider must be {' or '.join(PROVIDERS)}, got {provider!r}")
    spec = job_spec(source, opt.spec_values(ctx, *OWN))
    report = export_batch(spec, provider, provider_model, overwrite=overwrite)
    print(
        f"wrote {report['requests']} requests for {report['rows']} rows to {report['directory']} "
        f"({', '.join(report['files']) or 'no files'}); {report['error_records']} error records committed",
        file=sys.stderr,
    )
    if report["refused"] or report["local_only"]:
        print(
            f"{len(report['refused']) + report['local_only']} rows the provider cannot take are left for a "
            "local run of the job",
            file=sys.stderr,
        )
    return EXIT_OK


@app.command()
def collect(
    out: opt.OutDir,
    result_files: opt.ResultFiles,
    batch_dir: opt.BatchDir = None,
    as_json: opt.AsJson = False,
) -> int:
    """Commit a provider's batch results as shards of the job in OUT: `status`, `export` and a resumed
    run treat them as a local run's. Collecting a file twice adds nothing; expired or canceled requests
    stay undone, and a plain rerun of the job finishes them locally.

    Exit code 0 when every row is done, 3 done with row errors, 8 while rows remain.
    """
    from bulkrun.job.batch_import import import_batch

    report = import_batch(Path(out), list(result_files), batch_dir)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"collected {report['results']} results and {report['errors']} errors into {out} "
            f"({report['already_done']} already done, {len(report['retryable'])} retryable left undone); "
            f"{report['remaining']} rows remain",
            file=sys.stderr,
        )
    if report["remaining"]:
        return EXIT_INCOMPLETE
    return EXIT_ROW_ERRORS if report.get("errors_total") else EXIT_OK
