"""The encoder engine: whole prompts packed into steps under a token budget, each pooled into a vector.

An encoder attends both ways, so a sequence must be whole in one step and nothing is kept between
steps: no KV cache, no chunked prefill, no decode phase. Requests arrive length-sorted from the job's
windows, so taking them in order until the step's token budget is full packs similar lengths
together; the step is one packed [T] batch with no padding at all. The same stream/generate interface
as Engine, so the job layer runs either. Plain Python: the runner holds the tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.limits import EngineLimits
from bulkrun.engine.core.outputs import RequestOutput, StepStats
from bulkrun.engine.core.params import EngineRequest
from bulkrun.engine.core.request import validate_engine_request

# Budgets when the user gives none. An encoder step has no KV cache to fill, so it can be larger than
# a decoder's: big enough for efficient matmuls, small enough that [T, intermediate] stays modest.
CPU_ENCODER_BUDGET = (256, 4096)  # (sequences, tokens)
CUDA_ENCODER_BUDGET = (1024, 32768)


def encoder_limits(config: EngineConfig, device_type: str) -> EngineLimits:
    seqs, tokens = CUDA_ENCODER_BUDGET if device_type == "cuda" else CPU_ENCODER_BUDGET
    return EngineLimits(
        device=device_type,
        max_num_seqs=config.max_num_seqs or seqs,
        max_num_batched_tokens=config.max_num_batched_tokens or tokens,
        chosen_for_device=config.max_num_seqs is None or config.max_num_batched_tokens is None,
    )


class EncoderEngine:
    def __init__(self, runner: Any, config: EngineConfig | None = None):
        """`runner` provides tokenizer, max_model_len, vocab_size, limits, dtype, dtype_reason and
        embed(list[EngineRequest]) -> one vector per request (bulkrun.engine.worker.encoder_runner)."""
        self.config = config or EngineConfig()
        self.runner = runner
        self.tokenizer = runner.tokenizer
        self.max_model_len = runner.max_model_len
        self.vocab_size: int | None = getattr(runner, "vocab_size", None)
        dtype = getattr(runner, "dtype", None)
        self.dtype: str | None = None if dtype is None else str(dtype).removeprefix("torch.")
        self.dtype_reason: str | None = getattr(runner, "dtype_reason", None)
        self.limits: EngineLimits = runner.limits
        self.last_stats = StepStats()

    def stream(
        self, requests: Iterable[EngineRequest], on_step: Callable[[StepStats], None] | None = None
    ) -> Iterator[RequestOutput]:
        """Pack requests in arrival order into steps of at most the budget's tokens and sequences (a
        prompt longer than the budget runs alone); yield each step's vectors. A request this engine
        cannot serve is yielded at once as an error result."""
        budget, max_seqs = self.limits.max_num_batched_tokens, self.limits.max_num_seqs
        batch: list[EngineRequest] = []
        tokens = 0
        for req in requests:
            why = self.refusal(req)
            if why is not None:
                yield _error_output(req, why)
                continue
            n = len(req.prompt_token_ids)
            if batch and (tokens + n > budget or len(batch) >= max_seqs):
                yield from self._step(batch, on_step)
                batch, tokens = [], 0
            batch.append(req)
            tokens += n
        if batch:
            yield from self._step(batch, on_step)

    def generate(self, requests: list[EngineRequest]) -> list[RequestOutput]:
        """Run all requests; results in request order."""
        return list(self.stream(requests))

    def refusal(self, req: EngineRequest) -> str | None:
        """Why this engine cannot serve the request, or None."""
        try:
            validate_engine_request(req)
        except ValueError as exc:
            return str(exc)
        if req.pooling is None or req.continuations is not None:
            return "this model is an encoder: it only embeds (pooling requests), it cannot generate or score"
        n = len(req.prompt_token_ids)
        if n > self.max_model_len:
            return f"prompt of {n} tokens is longer than the model's {self.max_model_len}"
        if self.vocab_size is not None and max(req.prompt_token_ids) >= self.vocab_size:
            return f"a token id is outside the vocabulary ({self.vocab_size})"
        return None

    def _step(self, batch: list[EngineRequest], on_step) -> list[RequestOutput]:
        vectors = self.runner.embed(batch)
        outputs = [
            RequestOutput(
                req.request_id, list(req.prompt_token_ids), finish_reason="pooled", embedding=vector
            )
            for req, vector in zip(batch, vectors, strict=True)
        ]
        tokens = sum(len(req.prompt_token_ids) for req in batch)
        self.last_stats = StepStats(
            num_scheduled_tokens=tokens,
            num_prefill_tokens=tokens,
            num_running=len(batch),
            num_finished=len(batch),
        )
        if on_step is not None:
            on_step(self.last_stats)
        return outputs


def _error_output(req: EngineRequest, why: str) -> RequestOutput:
    return RequestOutput(req.request_id, list(req.prompt_token_ids), finish_reason="error", error=why)
