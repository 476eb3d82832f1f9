"""The model runner: owns the model, the KV cache and the sampler; executes one scheduled step.

launch() builds the step from persistent host state (StepState), runs the model and the sampler,
and returns a handle; the sampled tokens stay on the device until the handle's result() is asked
for, so on CUDA the host can schedule and launch the next step meanwhile (async scheduling): the
next step takes the inputs it needs from the previous step's token tensor on the device.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from itertools import repeat
from operator import attrgetter, is_

import torch

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.limits import EngineLimits, choose_limits
from bulkrun.engine.core.runner_output import RunnerOutput
from bulkrun.engine.core.scheduler import SchedulerOutput
from bulkrun.engine.structured_output.step_masks import GrammarMasks, StepMasks
from bulkrun.engine.worker import loaded_model
from bulkrun.engine.worker.decode_graphs import DecodeGraphs, graph_batch_sizes
from bulkrun.engine.worker.kv_cache import KVCache, default_cpu_kv_bytes, default_cuda_kv_bytes
from bulkrun.engine.worker.pooling import pool_last_rows
from bulkrun.engine.worker.sampler import Sampler
from bulkrun.engine.worker.score_logprobs import compute_logprobs
from bulkrun.engine.worker.step_inputs import StepInputs, StepState
from bulkrun_kernels.reference import plan_attention

log = logging.getLogger(__name__)

_request_id = attrgetter("request_id")
_params = attrgetter("params")


class ModelRunner:
    def __init__(self, model_dir: str, config: EngineConfig):
        self.config = config
        loaded = loaded_model.load(model_dir, config)
        self.tokenizer, self.ops, self.model = loaded.tokenizer, loaded.ops, loaded.model
        self.device, self.dtype, self.dtype_reason = loaded.device, loaded.dtype, loaded.dtype_reason
        # greedy rows without logprobs: exact argmax from a bf16 screen (None where that is not faster)
        self.greedy_head = loaded.greedy_head
        self.onednn = loaded.onednn
        self.batch_invariant = loaded.batch_invariant
        cfg = self.model.cfg
        self.vocab_size = cfg.vocab_size
        # constrained rows' masks (grammar_step.py); overlapped with the forward only on a GPU
        self.grammar_masks = GrammarMasks(cfg.vocab_size, overlap=self.device.type != "cpu")
        self.max_model_len = min(cfg.max_model_len, config.max_model_len or cfg.max_model_len)
        self.eos_token_ids = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.block_size = config.block_size
        memory = (
            torch.cuda.get_device_properties(self.device).total_memory if self.device.type == "cuda" else 0
        )
        self.limits: EngineLimits = choose_limits(config, self.device.type, memory)
        budget = self._kv_budget()
        # one block more than the scheduler sees: the padding rows of a captured decode step write there
        self.kv_cache = KVCache.from_budget(cfg, budget, self.block_size, self.dtype, self.device)
        self.num_blocks = self.kv_cache.num_blocks - 1
        if self.num_blocks < 1:
            raise ValueError(
                f"the KV cache budget ({budget} bytes) holds fewer than 2 blocks; raise kv_cache_bytes"
            )
        self.limits.num_kv_blocks, self.limits.kv_cache_bytes = self.num_blocks, budget
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        self.state = StepState(self.block_size, self.limits.max_num_seqs, self.max_blocks_per_seq)
        self.sampler = Sampler()
        self.runs_asynchronously = self.device.type == "cuda"  # the engine's async default
        self.pools = True  # POOL requests: their last prompt row's final hidden state (pooling.py)
        self._prev_tokens: torch.Tensor | None = None  # the last step's sampled tokens, on the device
        self._prev_rows: Mapping[str, int] = {}  # request id -> row of _prev_tokens
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda" and config.cuda_graphs:
            self.graphs = DecodeGraphs.capture(self, graph_batch_sizes(self.limits.max_num_seqs))

    def _kv_budget(self) -> int:
        if self.config.kv_cache_bytes is not None:
            return self.config.kv_cache_bytes
        if self.device.type != "cuda":
            return default_cpu_kv_bytes()
        self.limits.profile_peak_bytes = self._profile_activation_bytes()
        return default_cuda_kv_bytes(self.device, self.limits.profile_peak_bytes)

    @property
    def padding_block(self) -> int:
        """The block the padding rows of a captured step write into (never handed out)."""
        return self.num_blocks

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        return self.launch(out).result(by_request_id=True)

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> StepHandle:
        """Run the step on the device; the handle's result() waits for its tokens."""
        result = RunnerOutput()
        if not out.requests:
            return StepHandle(result)
        inputs = self._to_device(self.state.build(out, self._prev_rows))
        if inputs.pending_inputs:
            at, prev = zip(*inputs.pending_inputs, strict=True)
            index = torch.tensor(at, device=self.device)
            inputs.input_ids[index] = self._prev_tokens[torch.tensor(prev, device=self.device)]
        requests = inputs.sample_requests
        # the constrained rows' masks (none when the engine says no request is constrained)
        masks = self.grammar_masks.start(requests) if out.constrained is not False else None
        h = self._final_hidden(inputs)
        if inputs.scores.pool_requests:
            pool_last_rows(inputs.scores, h, result)
        # the running batch knows when every request takes the plain argmax: no per-row look
        plain = out.batch is not None and out.batch.num_not_plain_greedy == 0
        tokens = self._sample(requests, h, inputs, result, masks, plain)
        self._prev_tokens, self._prev_rows = tokens, _RowOf(requests)
        return StepHandle(result, tokens, requests)

    def _final_hidden(self, inputs: StepInputs) -> torch.Tensor:
        # a decode step in which every row samples: its logits rows are exactly its rows
        if self.graphs is not None and inputs.decode_only and len(inputs.sample_requests) == inputs.num_rows:
            h = self.graphs.run(inputs)
            if h is not None:
                return h
        return self.model.final_hidden(
            inputs.input_ids, inputs.metadata, self.kv_cache.layers, inputs.logits_indices
        )

    def _sample(
        self,
        requests: list,
        h: torch.Tensor,
        inputs: StepInputs,
        result: RunnerOutput,
        masks: StepMasks | None,
        all_plain_greedy: bool = False,
    ) -> torch.Tensor:
        """Tokens of the sample rows (h's first len(requests) rows), left on the device; fills
        result's log-probabilities and scores. Constrained rows sample from masked logits."""
        n = len(requests)
        greedy = list(range(n)) if all_plain_greedy else self._greedy_rows(requests)
        tokens = torch.empty(n, dtype=torch.long, device=h.device)
        if self.greedy_head is not None and greedy:
            if len(greedy) == n:
                tokens = self.greedy_head(h[:n])
                logits = self.model.logits(h[n:])
                rest = []
            else:
                tokens[greedy] = self.greedy_head(h[greedy])
                logits = self.model.logits(_without_rows(h, greedy))  # every other row, in order
                screened = set(greedy)
                rest = [i for i in range(n) if i not in screened]
            if masks is not None:
                masks.screen(tokens, greedy, h, self.model)
                masks.apply(logits, rest)
        else:
            logits = self.model.logits(h)
            if masks is not None:
                masks.apply(logits, range(n))
            if len(greedy) == n:  # argmax on the device: nothing waits for the host
                tokens = logits[:n].argmax(dim=-1)
                rest = []
            else:
                rest = list(range(n))
        if rest:
            params = [requests[i].params for i in rest]
            # the index of the token drawn: a pure function of the position, whatever has landed
            output_indices = [int(inputs.sample_ends[i]) - requests[i].num_prompt_tokens for i in rest]
            drawn, row_logprobs = self.sampler(logits[: len(rest)], params, output_indices)
            tokens[torch.tensor(rest, device=h.device)] = torch.tensor(drawn, device=h.device)
            for j, value in row_logprobs.items():
                result.sampled_logprobs[requests[rest[j]].request_id] = value
        compute_logprobs(inputs.scores, logits, len(rest), result)
        return tokens

    def _greedy_rows(self, requests: list) -> list[int]:
        """The sample rows whose token is the argmax and that ask for no log-probability."""
        params = list(map(_params, requests))
        if params and all(map(is_, params, repeat(params[0]))):  # the common bulk case: one object for all
            p = params[0]
            return list(range(len(requests))) if p.plain_greedy else []
        return [i for i, p in enumerate(params) if p.plain_greedy]

    def _to_device(self, inputs: StepInputs) -> StepInputs:
        md = inputs.metadata
        query_start_loc, seq_lens = md.query_start_loc, md.seq_lens  # host copies for the plan
        if self.device.type != "cpu":  # from pinned staging copies, so the copies are asynchronous
            for name in ("positions", "slot_mapping", "block_tables", "query_start_loc", "seq_lens"):
                setattr(md, name, getattr(md, name).pin_memory().to(self.device, non_blocking=True))
            inputs.input_ids = inputs.input_ids.pin_memory().to(self.device, non_blocking=True)
            inputs.logits_indices = inputs.logits_indices.pin_memory().to(self.device, non_blocking=True)
        if self.ops.backend == "reference":
            md.plan = plan_attention(md.block_tables, query_start_loc, seq_lens, self.block_size, self.dtype)
        return inputs

    @torch.inference_mode()
    def _profile_activation_bytes(self) -> int:
        """Peak extra device memory of a step at the full token budget: one prompt chunk whose
        every row is scored (a long continuation), so its logits and log_softmax are all there."""
        from bulkrun.engine.core.params import SamplingParams
        from bulkrun.engine.core.request import Request
        from bulkrun.engine.core.scheduler import ScheduledRequest
        from bulkrun.engine.worker.step_inputs import build_step_inputs

        cfg = self.model.cfg
        tokens = max(1, min(self.limits.max_num_batched_tokens, self.max_model_len))
        num_blocks = -(-tokens // self.block_size)
        scratch = KVCache(cfg, num_blocks, self.block_size, self.dtype, self.device)
        request = Request(
            "profile", SamplingParams(), [0] * tokens, tokens, block_table=list(range(num_blocks))
        )
        inputs = self._to_device(
            build_step_inputs([ScheduledRequest(request, tokens, False)], self.block_size)
        )
        inputs.logits_indices = torch.arange(tokens, device=self.device)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        logits = self.model(inputs.input_ids, inputs.metadata, scratch.layers, inputs.logits_indices)
        logits.float().log_softmax(dim=-1)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del scratch, logits, inputs
        torch.cuda.empty_cache()
        return peak


class _RowOf(Mapping):
    """Request id -> its row among a step's sample rows (`requests`), the dict built only when a later
    step asks (async scheduling, for the inputs still in flight): a synchronous step never pays."""

    def __init__(self, requests: list):
        self._requests, self._rows = requests, None

    def _index(self) -> dict[str, int]:
        if self._rows is None:
            self._rows = {r.request_id: i for i, r in enumerate(self._requests)}
        return self._rows

    def __getitem__(self, request_id: str) -> int:
        return self._index()[request_id]

    def __iter__(self):
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._requests)


def _without_rows(h: torch.Tensor, rows: list[int]) -> torch.Tensor:
    if not rows:
        return h
    keep = torch.ones(h.shape[0], dtype=torch.bool, device=h.device)
    keep[rows] = False
    return h[keep]


class StepHandle:
    """A launched step: result() waits for its sampled tokens and returns the RunnerOutput."""

    def __init__(self, result: RunnerOutput, tokens: torch.Tensor | None = None, requests: list = ()):
        self._result, self._requests = result, requests
        self._tokens = tokens
        self._event = None
        if tokens is not None and tokens.is_cuda:  # copy back without blocking; wait in result()
            self._tokens = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self._tokens.copy_(tokens, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def result(self, by_request_id: bool = False) -> RunnerOutput:
        """The step's output, its tokens in sample-row order (what the scheduler reads); with
        `by_request_id` also keyed by request id (a dict of every row: for callers that want it)."""
        if self._tokens is not None:
            if self._event is not None:
                self._event.synchronize()
            self._result.sampled_tokens = self._tokens.numpy()  # host memory (pinned on CUDA)
            self._tokens = None
        if by_request_id and self._result.sampled_tokens is not None and not self._result.sampled:
            ids = map(_request_id, self._requests)
            self._result.sampled = dict(zip(ids, self._result.sampled_tokens.tolist(), strict=True))
        return self._result
