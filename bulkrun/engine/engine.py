"""The engine: a Scheduler and a BlockPool (plain Python) driving a ModelRunner (tensors).

One step = schedule, execute one packed batch, apply the results, and hand back the requests that
finished in it. Nothing here imports torch; the real runner is imported only by from_model().
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bulkrun.engine.block_pool import BlockPool
from bulkrun.engine.config import EngineConfig
from bulkrun.engine.outputs import RequestOutput, StepStats
from bulkrun.engine.params import EngineRequest
from bulkrun.engine.request import Request, RequestKind
from bulkrun.engine.runner_output import RunnerOutput
from bulkrun.engine.scheduler import Scheduler, SchedulerOutput
from bulkrun.engine.stop import StopStringMatcher, decode_output

_NOTHING_RUN = RunnerOutput()


class Engine:
    def __init__(self, runner: Any, config: EngineConfig | None = None):
        """`runner` provides num_blocks, block_size, max_model_len, eos_token_ids, tokenizer and
        execute(SchedulerOutput) -> RunnerOutput (bulkrun.engine.runner.ModelRunner, or a fake)."""
        self.config = config or EngineConfig()
        self.runner = runner
        self.tokenizer = runner.tokenizer
        self.max_model_len = runner.max_model_len
        if self.config.max_model_len is not None:
            self.max_model_len = min(self.max_model_len, self.config.max_model_len)
        self.vocab_size: int | None = getattr(runner, "vocab_size", None)
        self.pool = BlockPool(runner.num_blocks, runner.block_size, self.config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.pool,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            eos_token_ids=runner.eos_token_ids,
        )
        self._stop_matchers: dict[str, StopStringMatcher] = {}
        self.last_stats = StepStats(kv_blocks_total=self.pool.num_blocks)
        self.totals: dict[str, float] = dict.fromkeys(_TOTAL_KEYS, 0)
        self.totals["kv_blocks_total"] = self.pool.num_blocks

    @classmethod
    def from_model(cls, model_dir: str, config: EngineConfig | None = None) -> Engine:
        """Load the model in the local directory `model_dir` (the job layer resolves references)."""
        from bulkrun.engine.runner import ModelRunner  # torch lives behind this import

        config = config or EngineConfig()
        return cls(ModelRunner(str(model_dir), config), config)

    # ---- intake -------------------------------------------------------------------------------

    def add_request(self, req: EngineRequest) -> None:
        """Queue a request. Raises ValueError when it is malformed; one that is merely too long
        comes back from a later step() with finish_reason "error"."""
        if self.vocab_size is not None:
            _check_vocab(req, self.vocab_size)
        request = self.scheduler.add_request(req)
        stops = request.params.stop
        if stops and request.generates:
            self._stop_matchers[request.request_id] = StopStringMatcher(
                self.tokenizer, stops, request.num_prompt_tokens
            )

    def has_capacity(self) -> bool:
        return self.scheduler.num_waiting < self.config.max_waiting

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return the requests that finished in it, in completion order."""
        started = time.perf_counter()
        sched = self.scheduler.schedule()
        runner_started = time.perf_counter()
        result = self.runner.execute(sched) if sched.scheduled else _NOTHING_RUN
        runner_seconds = time.perf_counter() - runner_started
        decode_tokens = _count_decode_tokens(sched)  # before update() moves the counters
        finished = self.scheduler.update(sched, result)
        if self._stop_matchers:
            self._check_stop_strings(sched, finished)
        if not sched.scheduled and not finished and self.scheduler.has_unfinished():
            finished += self.scheduler.fail_stalled()  # never spin without progress
        outputs = [self._make_output(req) for req in finished]
        self._record(sched, decode_tokens, outputs, time.perf_counter() - started, runner_seconds)
        return outputs

    def _check_stop_strings(self, sched: SchedulerOutput, finished: list[Request]) -> None:
        for item in sched.scheduled:
            if not item.sample:
                continue
            req = item.request
            matcher = self._stop_matchers.get(req.request_id)
            if matcher is None or not matcher.update(req.token_ids):
                continue
            if not req.is_finished:
                finished.append(req)
            self.scheduler.finish_request(req, "stop")  # also overrides a same-step "length"

    def _make_output(self, req: Request) -> RequestOutput:
        out = RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.token_ids[: req.num_prompt_tokens],
            finish_reason=req.finish_reason,
            num_cached_tokens=req.num_cached_tokens,
            error=req.error,
        )
        if req.kind is RequestKind.SCORE_PARENT:
            if req.finish_reason == "scored":
                out.continuation_logprobs = req.continuation_logprobs()
            return out
        out.output_token_ids = req.output_token_ids
        if req.params.logprobs:
            out.logprobs = req.output_logprobs
        matcher = self._stop_matchers.pop(req.request_id, None)
        if matcher is not None and matcher.stopped:
            out.text = matcher.text
        elif out.output_token_ids:
            out.text = self._decode(req)
        return out

    def _decode(self, req: Request) -> str:
        end = len(req.token_ids)
        if req.finish_reason == "stop":  # the stop token's own text is not part of the answer
            end -= 1
        return decode_output(self.tokenizer, req.token_ids, req.num_prompt_tokens, end)

    def _record(
        self,
        sched: SchedulerOutput,
        decode_tokens: int,
        outputs: list[RequestOutput],
        seconds: float,
        runner_seconds: float,
    ) -> None:
        stats = StepStats(
            num_scheduled_tokens=sched.num_scheduled_tokens,
            num_prefill_tokens=sched.num_scheduled_tokens - decode_tokens,
            num_decode_tokens=decode_tokens,
            num_running=len(sched.scheduled),
            num_waiting=self.scheduler.num_waiting,
            num_preempted=len(sched.preempted),
            kv_blocks_used=self.pool.num_used_blocks,
            kv_blocks_total=self.pool.num_blocks,
            prefix_cache_hit_tokens=sched.num_prefix_hit_tokens,
            num_finished=len(outputs),
        )
        self.last_stats = stats
        t = self.totals
        t["steps"] += 1
        t["scheduled_tokens"] += stats.num_scheduled_tokens
        t["prefill_tokens"] += stats.num_prefill_tokens
        t["decode_tokens"] += stats.num_decode_tokens
        t["generated_tokens"] += sum(1 for s in sched.scheduled if s.sample)
        t["running_sum"] += stats.num_running
        t["mean_running_batch"] = t["running_sum"] / t["steps"]
        t["prefix_cache_hit_tokens"] += stats.prefix_cache_hit_tokens
        t["preemptions"] += stats.num_preempted
        t["kv_blocks_used"] = stats.kv_blocks_used
        t["kv_blocks_peak"] = max(t["kv_blocks_peak"], stats.kv_blocks_used)
        t["finished"] += len(outputs)
        t["errors"] += sum(1 for o in outputs if o.finish_reason == "error")
        t["prompt_tokens"] += sum(len(o.prompt_token_ids) for o in outputs)
        t["step_seconds"] += seconds
        t["runner_seconds"] += runner_seconds

    # ---- driving ------------------------------------------------------------------------------

    def stream(
        self, requests: Iterable[EngineRequest], on_step: Callable[[StepStats], None] | None = None
    ) -> Iterator[RequestOutput]:
        """Feed requests as capacity allows and yield results in completion order. A malformed
        request is yielded at once as an error result instead of stopping the stream. `on_step` is
        called after every step with that step's StepStats."""
        pending = iter(requests)
        exhausted = False
        while True:
            while not exhausted and self.has_capacity():
                req = next(pending, None)
                if req is None:
                    exhausted = True
                    break
                try:
                    self.add_request(req)
                except ValueError as exc:
                    yield _error_output(req, str(exc))
            if not self.has_unfinished():
                if exhausted:
                    return
                continue
            outputs = self.step()
            if on_step is not None:
                on_step(self.last_stats)
            yield from outputs

    def generate(self, requests: list[EngineRequest]) -> list[RequestOutput]:
        """Run all requests to completion; results in request order."""
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("generate() needs distinct request ids")
        by_id = {out.request_id: out for out in self.stream(requests)}
        return [by_id[i] for i in ids]


_TOTAL_KEYS = (
    "steps",
    "scheduled_tokens",
    "prefill_tokens",
    "decode_tokens",
    "generated_tokens",
    "prompt_tokens",
    "running_sum",
    "mean_running_batch",
    "prefix_cache_hit_tokens",
    "preemptions",
    "kv_blocks_used",
    "kv_blocks_peak",
    "kv_blocks_total",
    "finished",
    "errors",
    "step_seconds",
    "runner_seconds",
)


def _count_decode_tokens(sched: SchedulerOutput) -> int:
    """Tokens computed one at a time past the prompt (the rest counts as prefill)."""
    return sum(
        1
        for s in sched.scheduled
        if s.num_tokens == 1 and s.request.num_computed_tokens >= s.request.num_prompt_tokens
    )


def _check_vocab(req: EngineRequest, vocab_size: int) -> None:
    seqs = [req.prompt_token_ids, *(req.continuations or ())]
    for seq in seqs:
        for t in seq:
            if t >= vocab_size:
                raise ValueError(
                    f"request {req.request_id!r}: token id {t} is outside the vocabulary ({vocab_size})"
                )


def _error_output(req: EngineRequest, why: str) -> RequestOutput:
    return RequestOutput(
        request_id=req.request_id,
        prompt_token_ids=list(req.prompt_token_ids),
        finish_reason="error",
        error=why,
    )
