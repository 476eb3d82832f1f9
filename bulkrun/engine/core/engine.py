"""The engine: a Scheduler and a BlockPool (plain Python) driving a ModelRunner (tensors).

One step = schedule, execute one packed batch, apply the results, and hand back the requests that
finished in it. Nothing here imports torch: bulkrun.engine.load builds one over the real runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bulkrun.engine.core.block_pool import BlockPool
from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.limits import EngineLimits, choose_limits
from bulkrun.engine.core.outputs import RequestOutput, StepStats
from bulkrun.engine.core.params import EngineRequest
from bulkrun.engine.core.request import Request, RequestKind
from bulkrun.engine.core.runner_output import RunnerOutput
from bulkrun.engine.core.scheduler import Scheduler, SchedulerOutput
from bulkrun.engine.core.stop import StopStringMatcher, decode_output
from bulkrun.engine.structured_output.requests import ConstrainedRequests

_NOTHING_RUN = RunnerOutput()


class Engine:
    def __init__(self, runner: Any, config: EngineConfig | None = None):
        """`runner` provides num_blocks, block_size, max_model_len, eos_token_ids, tokenizer and
        execute(SchedulerOutput) -> RunnerOutput, optionally launch(SchedulerOutput) -> a handle
        whose result() gives the RunnerOutput once the step's work lands (asynchronous devices)
        (bulkrun.engine.worker.runner.ModelRunner, or a fake)."""
        self.config = config or EngineConfig()
        self.runner = runner
        self.tokenizer = runner.tokenizer
        self.max_model_len = runner.max_model_len
        if self.config.max_model_len is not None:
            self.max_model_len = min(self.max_model_len, self.config.max_model_len)
        self.vocab_size: int | None = getattr(runner, "vocab_size", None)
        # what the model computes in and why (None from a runner that does not say)
        dtype = getattr(runner, "dtype", None)
        self.dtype: str | None = None if dtype is None else str(dtype).removeprefix("torch.")
        self.dtype_reason: str | None = getattr(runner, "dtype_reason", None)
        self.batch_invariant: bool | None = getattr(runner, "batch_invariant", None)
        self.pool = BlockPool(runner.num_blocks, runner.block_size, self.config.enable_prefix_caching)
        # the budget the runner chose for its device, or the config's (CPU defaults where unset)
        self.limits: EngineLimits = getattr(runner, "limits", None) or choose_limits(self.config, "cpu")
        self.scheduler = Scheduler(
            self.pool,
            max_num_seqs=self.limits.max_num_seqs,
            max_num_batched_tokens=self.limits.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            eos_token_ids=runner.eos_token_ids,
            # LongRoPE's short context (a runner whose model has one says so)
            long_rope_after=getattr(runner, "long_rope_after", None),
        )
        async_scheduling = self.config.async_scheduling
        if async_scheduling is None:  # on where the device runs apart from the host
            async_scheduling = bool(getattr(runner, "runs_asynchronously", False))
        self.async_scheduling = async_scheduling
        self._launch = getattr(runner, "launch", None) or (
            lambda sched: _CompletedStep(runner.execute(sched))
        )
        self._in_flight: tuple[SchedulerOutput, Any] | None = None  # launched, results not applied
        self._stop_matchers: dict[str, StopStringMatcher] = {}
        self.constrained = ConstrainedRequests(
            self.tokenizer, self.vocab_size, runner.eos_token_ids, self.config.grammar_time_limit_s
        )
        self.last_stats = StepStats(kv_blocks_total=self.pool.num_blocks)
        self._expert_tokens: tuple[int, ...] | None = None  # the landed step's expert load (MoE models)

    # ---- intake -------------------------------------------------------------------------------

    def add_request(self, req: EngineRequest) -> None:
        """Queue a request. Raises ValueError when it is malformed; one that is merely too long
        comes back from a later step() with finish_reason "error"."""
        if self.vocab_size is not None:
            _check_vocab(req, self.vocab_size)
        if req.pooling is not None:
            if not getattr(self.runner, "pools", False):
                raise ValueError("this model's runner cannot pool hidden states into embeddings")
            if req.pooling.method != "last":  # earlier rows' hidden states are gone once their chunk ran
                raise ValueError(
                    f"a decoder embedder pools the last token (--pooling last), not {req.pooling.method!r}"
                )
        spec = req.params.constraint
        matcher = self.constrained.matcher(spec) if spec is not None and req.continuations is None else None
        request = self.scheduler.add_request(req)
        if matcher is not None:
            self.constrained.attach(request, matcher)
        stops = request.params.stop
        if stops and request.generates:
            self._stop_matchers[request.request_id] = StopStringMatcher(
                self.tokenizer, stops, request.num_prompt_tokens
            )

    def has_capacity(self) -> bool:
        return self.scheduler.num_waiting < self.config.max_waiting

    def has_unfinished(self) -> bool:
        return self._in_flight is not None or self.scheduler.has_unfinished()

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return the requests that finished in it, in completion order.

        Synchronous: schedule step N, run it, apply its results. Asynchronous (one step of
        lookahead): schedule and launch step N+1 while step N may still run on the device, then
        apply step N's results; a request found finished then wastes its slot in step N+1, whose
        results for it are dropped."""
        # a constrained row's mask needs its previous token accepted: no lookahead while one runs
        pipelined = self.async_scheduling and not self.constrained.active
        finished = []
        if not pipelined and self._in_flight is not None:
            finished, self._in_flight = self._land(*self._in_flight), None
        sched = self.scheduler.schedule()
        sched.constrained = self.constrained.active
        launched = (sched, self._launch(sched)) if sched.requests else None
        if pipelined:
            landing, self._in_flight = self._in_flight, launched
        else:
            landing = launched
        # failed and finished-early requests come with the schedule; a launched step reports them
        # when it lands
        if launched is None:
            finished += self.scheduler.update(sched, _NOTHING_RUN)
        if landing is not None:
            finished += self._land(*landing)
        if launched is None and landing is None and not finished and self.scheduler.has_unfinished():
            finished += self.scheduler.fail_stalled()  # never spin without progress
        outputs = [self._make_output(req) for req in finished]
        self._record(sched, outputs)
        return outputs

    def _land(self, sched: SchedulerOutput, handle: Any) -> list[Request]:
        result = handle.result()
        self._expert_tokens = result.expert_tokens
        finished = self.scheduler.update(sched, result)
        if self.constrained.active:
            self.constrained.advance(sched.requests, sched.samples, finished, self.scheduler.finish_request)
        if self._stop_matchers:
            self._check_stop_strings(sched, finished)
        return finished

    def _check_stop_strings(self, sched: SchedulerOutput, finished: list[Request]) -> None:
        matchers = self._stop_matchers
        for req, sample in zip(sched.requests, sched.samples, strict=True):
            if not sample:
                continue
            matcher = matchers.get(req.request_id)
            if matcher is None or (req.is_finished and req not in finished):
                continue  # no stop strings, or finished before this step's token landed
            if not matcher.update(req.token_ids):
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
        if req.grammar is not None:
            self.constrained.release(req.request_id)
        if req.kind is RequestKind.POOL:
            out.embedding = req.embedding
            return out
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
        # the stop token's own text is not part of the answer (a finished grammar ends without one)
        if req.finish_reason == "stop" and req.token_ids[-1] in req.stop_token_set:
            end -= 1
        return decode_output(self.tokenizer, req.token_ids, req.num_prompt_tokens, end)

    def _record(self, sched: SchedulerOutput, outputs: list[RequestOutput]) -> None:
        decode = sched.num_decode_tokens
        self.last_stats = StepStats(
            num_scheduled_tokens=sched.num_scheduled_tokens,
            num_prefill_tokens=sched.num_scheduled_tokens - decode,
            num_decode_tokens=decode,
            num_running=len(sched.requests),
            num_waiting=self.scheduler.num_waiting,
            num_preempted=len(sched.preempted),
            kv_blocks_used=self.pool.num_used_blocks,
            kv_blocks_total=self.pool.num_blocks,
            kv_blocks_touched=self.pool.num_touched_blocks,
            prefix_cache_hit_tokens=sched.num_prefix_hit_tokens,
            num_finished=len(outputs),
            num_generated_tokens=int(sched.array("samples").sum()),
            expert_tokens=self._expert_tokens,
        )
        self._expert_tokens = None

    # ---- driving ------------------------------------------------------------------------------

    def stream(
        self, requests: Iterable[EngineRequest], on_step: Callable[[StepStats], None] | None = None
    ) -> Iterator[RequestOutput]:
        """THE engine loop: feed requests as capacity allows and yield results in completion
        order. A malformed request is yielded at once as an error result instead of stopping the
        stream. `on_step` gets every step's StepStats right after the step."""
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


class _CompletedStep:
    """The handle of a step a synchronous runner has already run."""

    __slots__ = ("_result",)

    def __init__(self, result: RunnerOutput):
        self._result = result

    def result(self) -> RunnerOutput:
        return self._result


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
