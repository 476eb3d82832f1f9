"""`bulkrun classify`: label every row by scoring each label as a continuation of its prompt."""

from __future__ import annotations

import typer

from bulkrun.cli import options as opt
from bulkrun.cli.app import app
from bulkrun.cli.outcome import run_task_command


@app.command()
def classify(
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
    labels: opt.Labels = None,
    labels_file: opt.LabelsFile = None,
    instruction: opt.Instruction = None,
    normalize: opt.Normalize = None,
    answer_prefix: opt.AnswerPrefix = None,
    calibrate: opt.Calibrate = None,
) -> int:
    """Classify every row: each label is scored under the row's prompt (no text is generated).

    Output per row: label, probability and label_probs (calibrated against the label prior of
    content-free inputs unless --calibrate none), their raw_ versions, and label_scores. The
    instruction (labels, descriptions, examples from a job spec) comes first in every prompt, so
    the prefix cache computes it once. Example:
    bulkrun classify tickets.parquet --labels billing,bug,feature --out runs/tickets
    """
    return run_task_command("classify", opt.spec_values(ctx))
