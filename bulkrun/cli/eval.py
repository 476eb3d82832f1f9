"""`bulkrun eval`: score a suite whose rows carry expected answers; optionally sweep combinations."""

from __future__ import annotations

import typer

from bulkrun.cli import options as opt
from bulkrun.cli.app import app
from bulkrun.cli.outcome import run_task_command


@app.command(name="eval")
def eval_(
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
    expected_field: opt.ExpectedField = None,
    answer_regex: opt.AnswerRegex = None,
    match: opt.Match = None,
    labels: opt.Labels = None,
    labels_file: opt.LabelsFile = None,
    instruction: opt.Instruction = None,
    normalize: opt.Normalize = None,
    answer_prefix: opt.AnswerPrefix = None,
    calibrate: opt.Calibrate = None,
    choices_field: opt.ChoicesField = None,
    context_field: opt.ContextField = None,
    target_delimiter: opt.TargetDelimiter = None,
    sweep_model: opt.SweepModel = None,
    sweep_template: opt.SweepTemplate = None,
    sweep_temperature: opt.SweepTemperature = None,
) -> int:
    """Evaluate a suite whose rows carry expected answers; metrics to OUT/metrics.json.

    Per-row correctness goes into the results; accuracy (and for --labels suites per-label
    precision/recall and a confusion matrix) into OUT/metrics.json and the end-of-job summary.

    With --labels the labels are scored (as in classify); otherwise the model generates and the
    answer is compared exactly, normalised (--match normalized), or as extracted by --answer-regex.
    With --choices-field each row has its own choices, scored by log-likelihood as
    lm-evaluation-harness's multiple_choice does (acc and acc_norm).
    Sweep options run one job per combination into OUT/runs/<name>/ and compare them in
    OUT/sweep.md and OUT/sweep.json.
    """
    values = opt.spec_values(ctx)
    for key in ("sweep_model", "sweep_temperature"):  # repeatable, and each may be a comma list
        if key in values:
            values[key] = [part.strip() for value in values[key] for part in value.split(",")]
    return run_task_command("eval", values)
