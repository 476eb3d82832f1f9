"""The largest step a run can take, and what its activations cost: what the KV cache is sized around.

The largest step holds the whole token budget (max_num_batched_tokens) in as many sequences as the
context length makes it take, and needs every row's logits and log-probabilities (a scoring step:
a long continuation, or many), while the sampler's temporaries for the most rows that sample in one
step (max_num_seqs; a full-vocabulary sort on a GPU) may be alive beside them. On a GPU the runner
runs that step on a scratch cache and measures its peak (ModelRunner._profile_activation_bytes); the
arithmetic here lays the step out, estimates the same bytes from the shapes (a floor under the
measurement, and what a CPU test checks for real model sizes) and sizes the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from bulkrun.engine.worker.score_logprobs import SCORE_CHUNK_ROWS

KV_FREE_FRACTION = 0.9  # of the device memory left after the weights: the rest is headroom


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def profile_step_lengths(budget_tokens: int, max_model_len: int) -> list[int]:
    """The largest step's sequences: the budget in as few sequences as the context allows."""
    budget = max(1, budget_tokens)
    longest = max(1, max_model_len)
    full, rest = divmod(budget, longest)
    return [longest] * full + ([rest] if rest else [])


def largest_step_bytes(shape: ModelShape, budget_tokens: int, max_num_seqs: int, dtype_bytes: int) -> dict:
    """Bytes the largest step allocates beyond the weights and the KV cache, by part, from shapes.

    logits: every row's, in the model dtype; log_softmax: an fp32 copy and its result for one chunk
    of rows; forward: the widest live activations (the MLP's gate, up and product rows, plus the
    residual and attention rows); sampler: the rows that sample at most, each sorting its whole
    vocabulary (fp32 values, int64 indices, softmax and cumsum)."""
    t, v = budget_tokens, shape.vocab
    q_kv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    rows = min(max_num_seqs, budget_tokens)
    parts = {
        "logits": t * v * dtype_bytes,
        "log_softmax": 2 * min(t, SCORE_CHUNK_ROWS) * v * 4,
        "forward": t * (3 * shape.intermediate + 3 * shape.hidden + q_kv) * dtype_bytes,
        "sampler": rows * v * (4 + 8 + 4 + 4),
    }
    parts["total"] = sum(parts.values())
    return parts


def weight_bytes(shape: ModelShape, dtype_bytes: int, tied: bool) -> int:
    attention = (
        shape.hidden * (shape.heads + 2 * shape.kv_heads) * shape.head_dim
        + shape.heads * shape.head_dim * shape.hidden
    )
    mlp = 3 * shape.hidden * shape.intermediate
    embeddings = shape.vocab * shape.hidden * (1 if tied else 2)
    return (shape.layers * (attention + mlp) + embeddings) * dtype_bytes


def kv_cache_bytes(free_bytes: int, activation_peak_bytes: int) -> int:
    """The KV cache: what is free after the weights, less headroom and the largest step's peak."""
    return max(0, int(KV_FREE_FRACTION * free_bytes) - activation_peak_bytes)


def describe(lengths: list[int], rows_sampled: int, peak_bytes: int) -> str:
    """The profiled step in words, for the engine's limits (and so a report)."""
    counts: dict[int, int] = {}
    for n in lengths:
        counts[n] = counts.get(n, 0) + 1
    layout = " + ".join(f"{c} x {n}" for n, c in sorted(counts.items(), reverse=True))
    return (
        f"{sum(lengths)} tokens ({layout}), every row scored, sampler on {rows_sampled} rows "
        f"(full-vocabulary sort): peak {peak_bytes / 2**30:.2f} GiB"
    )
