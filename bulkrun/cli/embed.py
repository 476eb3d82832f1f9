"""`bulkrun embed`: turn every row's text into a vector (an encoder or a decoder embedder)."""

from __future__ import annotations

import typer

from bulkrun.cli import options as opt
from bulkrun.cli.app import app
from bulkrun.cli.outcome import run_task_command


@app.command()
def embed(
    ctx: typer.Context,
    input: opt.Input,
    out: opt.Out = None,
    model: opt.Model = None,
    id_field: opt.IdField = None,
    text_field: opt.TextField = None,
    prompt_template: opt.PromptTemplate = None,
    keep_fields: opt.KeepFields = None,
    max_model_len: opt.MaxModelLen = None,
    window: opt.Window = None,
    sort_by_length: opt.SortByLength = None,
    checkpoint_every: opt.CheckpointEvery = None,
    quiet: opt.Quiet = None,
    restart: opt.Restart = None,
    max_num_batched_tokens: opt.MaxNumBatchedTokens = None,
    max_num_seqs: opt.MaxNumSeqs = None,
    kernels: opt.Kernels = None,
    device: opt.Device = None,
    dtype: opt.Dtype = None,
    ray: opt.Ray = None,
    ray_address: opt.RayAddress = None,
    workers: opt.Workers = None,
    shard: opt.Shard = None,
    pooling: opt.Pooling = None,
    normalize: opt.Normalize = None,
    dimensions: opt.Dimensions = None,
    max_length: opt.MaxLength = None,
    truncate: opt.Truncate = None,
    embedding_dtype: opt.EmbeddingDtype = None,
    query_prompt: opt.QueryPrompt = None,
    prompt_name: opt.PromptName = None,
) -> int:
    """Embed every row's text: one vector per row, stored as fixed_size_list<float32>[dim].

    The default model is the shipped all-MiniLM-L6-v2 (384 dims, mean pooling, normalized). Output
    per row: embedding, prompt_tokens, truncated; bulkrun.embeddings(OUT) gives ids and an (N, dim)
    array. OpenAI batch files with /v1/embeddings lines are answered in OpenAI's format. Example:
    bulkrun embed tickets.parquet --out runs/ticket-vectors
    """
    return run_task_command("embed", opt.spec_values(ctx))
