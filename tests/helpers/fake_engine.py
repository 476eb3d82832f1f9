"""FakeEngine: the Engine API with no model (the job layer's tests and benchmarks)."""

from __future__ import annotations

import hashlib
import json
import random

from bulkrun.engine.core.engine import Engine
from bulkrun.engine.core.outputs import RequestOutput, StepStats
from bulkrun.engine.core.params import EngineRequest


class FakeEngine:
    """The Engine API with no model: outputs are a hash of (prompt, seed), steps finish requests
    in a scrambled order, capacity is limited so backpressure is exercised."""

    def __init__(self, tokenizer, max_model_len: int = 512, max_waiting: int = 8, per_step: int = 3):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.max_waiting = max_waiting
        self.per_step = per_step
        self.waiting: list[EngineRequest] = []
        self.last_stats = StepStats(kv_blocks_total=100)
        self.added = 0
        self.steps = 0
        self._rng = random.Random(1234)

    stream = Engine.stream  # the engine's one loop, over this fake's add_request/step

    def add_request(self, req: EngineRequest) -> None:
        if not req.prompt_token_ids:
            raise ValueError("empty prompt")
        self.waiting.append(req)
        self.added += 1

    def has_capacity(self) -> bool:
        return len(self.waiting) < self.max_waiting

    def has_unfinished(self) -> bool:
        return bool(self.waiting)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        self._rng.shuffle(self.waiting)
        done, self.waiting = self.waiting[: self.per_step], self.waiting[self.per_step :]
        self.last_stats = StepStats(
            num_scheduled_tokens=sum(len(r.prompt_token_ids) for r in done),
            num_running=len(done),
            kv_blocks_used=len(done),
            kv_blocks_total=100,
        )
        return [self._output(r) for r in done]

    def _output(self, req: EngineRequest) -> RequestOutput:
        if req.continuations is not None:
            scores = [[-float(len(c))] * len(c) for c in req.continuations]
            return RequestOutput(req.request_id, req.prompt_token_ids, finish_reason="scored",
                                 continuation_logprobs=scores)  # fmt: skip
        key = json.dumps([req.prompt_token_ids, req.params.seed, req.params.temperature])
        digest = hashlib.sha256(key.encode()).hexdigest()
        n = min(req.params.max_tokens, 4)
        text = digest[: 2 * n]
        ids = [int(digest[i : i + 2], 16) for i in range(0, 2 * n, 2)]
        return RequestOutput(req.request_id, req.prompt_token_ids, ids, text, "length")
