"""`bulkrun embed`: turn every row's text into a vector (an encoder or a decoder embedder)."""

from __future__ import annotations

from pathlib import Path

from bulkrun.cli.app import INPUT, app
from bulkrun.cli.execute import run_task_command
from bulkrun.cli.options import DIST_OPTIONS, ENGINE_OPTIONS, INPUT_OPTIONS, RUN_OPTIONS, opt, options

_PROMPT_KEYS = ("out", "model", "id_field", "text_field", "prompt_template", "keep_fields")
_ENGINE_KEYS = ("max_batch_tokens", "max_seqs", "kernels", "device", "dtype")  # no KV cache to size
EMBED_OPTIONS = [
    opt("pooling", str, "--pooling", help="mean | cls | last (default: the model's sentence-transformers config; required for a plain HF directory)."),
    opt("normalize", bool, "--normalize/--no-normalize", help="Unit-length vectors (default: as the model's config says; off for a plain HF directory)."),
    opt("dimensions", int, "--dimensions", help="Keep the first N dimensions, then normalize (Matryoshka models)."),
    opt("max_length", int, "--max-length", help="Longest text in tokens (default: the model's max_seq_length, else its context)."),
    opt("truncate", bool, "--truncate/--no-truncate", help="Cut longer texts at --max-length and mark them truncated (default), or make them error records."),
    opt("embedding_dtype", str, "--embedding-dtype", help="float32 (default) or float16 (half the storage)."),
    opt("query_prompt", str, "--query-prompt", help="Instruction prefix put before every text (e.g. 'query: ' or an Instruct: line)."),
    opt("prompt_name", str, "--prompt-name", help="A prompt named in the model's config_sentence_transformers.json (e.g. query)."),
    opt("max_model_len", int, "--max-model-len", help="Cap the context length (tokens)."),
]  # fmt: skip
_SHARED = (
    [o for o in INPUT_OPTIONS if o.key in _PROMPT_KEYS]
    + RUN_OPTIONS
    + [o for o in ENGINE_OPTIONS if o.key in _ENGINE_KEYS]
    + DIST_OPTIONS
)


@app.command()
@INPUT
@options(_SHARED, EMBED_OPTIONS)
def embed(input: Path, opts: dict) -> int:
    """Embed every row's text: one vector per row, in Parquet as fixed_size_list<float32>[dim].

    The default model is the shipped all-MiniLM-L6-v2 (384 dims, mean pooling, normalized). Output per
    row: embedding, prompt_tokens, truncated; bulkrun.embeddings(OUT) gives ids and an (N, dim) array.
    OpenAI batch files with /v1/embeddings lines are answered in OpenAI's format (output.jsonl).
    Example: bulkrun embed tickets.parquet --out runs/tickets-vectors
    """
    return run_task_command("embed", input, opts)
