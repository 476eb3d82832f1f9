"""The model runner: owns the model, the KV cache and the sampler; executes one scheduled step.

launch() builds the step from the scheduler's RunningBatch (StepBuilder), sends it through Staging,
runs the model and the sampler, and returns a handle; sampled tokens, log-probabilities and scores
stay on the device until the handle's result() is asked for, so on CUDA the host can schedule and
launch the next step meanwhile (async scheduling): the next step takes the inputs it needs from the
previous step's token tensor on the device. Nothing in launch() waits for the device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from itertools import repeat
from operator import attrgetter, is_

import numpy as np
import torch

from bulkrun.engine.core.config import EngineConfig
from bulkrun.engine.core.limits import EngineLimits, choose_limits
from bulkrun.engine.core.runner_output import RunnerOutput
from bulkrun.engine.core.scheduler import SchedulerOutput
from bulkrun.engine.structured_output.step_masks import GrammarMasks, StepMasks
from bulkrun.engine.worker import loaded_model, memory_profile
from bulkrun.engine.worker.decode_graphs import DecodeGraphs, capture_wanted, graph_batch_sizes
from bulkrun.engine.worker.kv_cache import KVCache, default_cpu_kv_bytes
from bulkrun.engine.worker.pooling import pool_last_rows
from bulkrun.engine.worker.sampler import Sampler
from bulkrun.engine.worker.score_logprobs import score_logprobs
from bulkrun.engine.worker.staging import Staging
from bulkrun.engine.worker.step_inputs import StepBuilder, StepInputs
from bulkrun.model.attention_metadata import SampledRows
from bulkrun.model.config import ModelConfig
from bulkrun_kernels.reference import plan_attention

log = logging.getLogger(__name__)

PREMAP_STEPS = 8  # full steps' tokens of KV cache mapped while the model loads (CPU): 16,384 by default

_request_id = attrgetter("request_id")
_params = attrgetter("params")


class ModelRunner:
    def __init__(self, model_dir: str, config: EngineConfig):
        self.config = config
        early_kv = _cpu_kv_cache_before_load(model_dir, config)
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
        self.long_rope_after = cfg.long_rope_after  # LongRoPE's short context: the scheduler's switch
        self.builder = StepBuilder(self.block_size, self.long_rope_after)
        self.staging = Staging(self.device)  # every host <-> device crossing of a step
        # top-p candidates widened on the host only where host and device are one (the CPU)
        self.sampler = Sampler(staging=self.staging, widen_on_host=self.device.type == "cpu")
        memory = (
            torch.cuda.get_device_properties(self.device).total_memory if self.device.type == "cuda" else 0
        )
        self.limits: EngineLimits = choose_limits(config, self.device.type, memory)
        if early_kv is not None and early_kv[0].holds(cfg, self.dtype):
            self.kv_cache, budget = early_kv
        else:
            if early_kv is not None:  # its pages are not this model's: stop mapping them
                early_kv[0].stop_premap()
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
        self.runs_asynchronously = self.device.type == "cuda"  # the engine's async default
        self.pools = True  # POOL requests: their last prompt row's final hidden state (pooling.py)
        self._prev_tokens: torch.Tensor | None = None  # the last step's sampled tokens, on the device
        self._prev_rows: Mapping[str, int] = {}  # request id -> row of _prev_tokens
        self.graphs: DecodeGraphs | None = None
        if capture_wanted(self.device.type, config.cuda_graphs, self.ops.backend):
            self.graphs = DecodeGraphs.capture(self, graph_batch_sizes(self.limits.max_num_seqs))

    def _kv_budget(self) -> int:
        if self.config.kv_cache_bytes is not None or self.device.type != "cuda":
            return _set_or_cpu_kv_budget(self.config)
        self.limits.profile_peak_bytes = self._profile_activation_bytes()
        free, _ = torch.cuda.mem_get_info(self.device)
        return memory_profile.kv_cache_bytes(free, self.limits.profile_peak_bytes)

    @property
    def padding_block(self) -> int:
        """The block the padding rows of a captured step write into (never handed out)."""
        return self.num_blocks

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        return self.launch(out).result(by_request_id=True)

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> StepHandle:
        """Queue the step on the device; the handle's result() waits for its tokens. Nothing in
        here waits for the device (tests/model/test_runner_syncs.py): host data crosses through
        self.staging, and every result stays on the device until result()."""
        result = RunnerOutput()
        if not out.requests:
            return StepHandle(result)
        inputs = self.builder.build(out, self._prev_rows)
        self._map_kv_pages(inputs.metadata.slot_mapping)
        self.kv_cache.copy_slots(out.kv_copies)  # before this step writes any KV
        inputs = self._to_device(inputs)
        self._place_pending_inputs(inputs)
        requests = inputs.sample_requests
        # the constrained rows' masks (none when the engine says no request is constrained)
        masks = self.grammar_masks.start(requests) if out.constrained is not False else None
        h = self._final_hidden(inputs)
        handle = StepHandle(result, requests, self.staging)
        if inputs.scores.pool_requests:
            pool_last_rows(inputs.scores, h, handle)
        # the running batch knows when every request takes the plain argmax: no per-row look
        plain = out.batch is not None and out.batch.num_not_plain_greedy == 0
        tokens = self._sample(requests, h, inputs, handle, masks, plain)
        self._prev_tokens, self._prev_rows = tokens, _RowOf(requests)
        load = self.model.expert_load()  # MoE models: tokens per expert, read back with the tokens
        if load is not None:
            handle.read_back(load, _fill_expert_tokens)
        handle.launched(tokens)
        return handle

    def _map_kv_pages(self, slot_mapping: torch.Tensor) -> None:
        """The step's KV writes land in mapped memory (kv_cache.py: CPU pages are mapped in bulk)."""
        if self.kv_cache.resident_blocks < self.kv_cache.num_blocks and len(slot_mapping):
            self.kv_cache.ensure_resident(int(slot_mapping.max()) // self.block_size)

    def _place_pending_inputs(self, inputs: StepInputs) -> None:
        """Inputs that are the previous step's sampled tokens, taken from them on the device."""
        k = len(inputs.pending_at)
        if not k:
            return
        if inputs.pending_rows_line_up:  # an unchanged decode batch: one slice copy
            inputs.input_ids[:k].copy_(self._prev_tokens[:k])
            return
        stage = self.staging.to_device
        rows = self._prev_tokens.index_select(0, stage(inputs.pending_rows))
        inputs.input_ids.index_copy_(0, stage(inputs.pending_at), rows)

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
        handle: StepHandle,
        masks: StepMasks | None,
        all_plain_greedy: bool = False,
    ) -> torch.Tensor:
        """Tokens of the sample rows (h's first len(requests) rows), left on the device, as are the
        log-probabilities and scores the handle reads back. Constrained rows sample from masked
        logits (never from the screened greedy head, whose token the host would have to check)."""
        n = len(requests)
        stage = self.staging.to_device
        greedy = list(range(n)) if all_plain_greedy else self._greedy_rows(requests)
        if self.greedy_head is not None and greedy:
            if masks is not None:
                greedy = [i for i in greedy if not masks.covers(i)]
        if self.greedy_head is not None and greedy:
            if len(greedy) == n:
                tokens = self.greedy_head(h[:n])
                rest = []
            else:
                screened = stage(greedy, torch.int64)
                tokens = torch.empty(n, dtype=torch.long, device=h.device)
                tokens.index_copy_(0, screened, self.greedy_head(h.index_select(0, screened)))
                taken = set(greedy)
                rest = [i for i in range(n) if i not in taken]
            # every other row, in order: the sampled rows, then the scored ones
            logits = self.model.logits(h[n:] if not rest else _rows_from(h, rest, n, stage))
            if masks is not None:
                masks.apply(logits, rest, stage)
        else:
            logits = self.model.logits(h)
            if masks is not None:
                masks.apply(logits, range(n), stage)
            rest = [] if len(greedy) == n else list(range(n))
            tokens = logits[:n].argmax(dim=-1) if not rest else None
            if not rest:  # the scored rows follow the greedy sample rows
                logits = logits[n:]
        if rest:
            params = [requests[i].params for i in rest]
            # the index of the token drawn: a pure function of the position, whatever has landed
            output_indices = [int(inputs.sample_ends[i]) - requests[i].num_prompt_tokens for i in rest]
            drawn = self.sampler(logits[: len(rest)], params, output_indices)
            if tokens is None:  # every row was drawn
                tokens = drawn.tokens
            else:
                tokens.index_copy_(0, stage(rest, torch.int64), drawn.tokens)
            if drawn.logprobs is not None:
                ids = [requests[rest[j]].request_id for j in drawn.logprob_rows]
                handle.read_back(drawn.logprobs, _fill_sampled_logprobs(ids))
        for values, fill in score_logprobs(inputs.scores, logits, len(rest), stage):
            handle.read_back(values, fill)
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
        host = md.block_tables, md.query_start_loc, md.seq_lens  # for the reference kernels' plan
        stage = self.staging.to_device
        for name in ("positions", "slot_mapping", "block_tables", "query_start_loc", "seq_lens"):
            setattr(md, name, stage(getattr(md, name)))
        if md.rope_rows is not None:
            md.rope_rows = stage(md.rope_rows)
        if md.sampled is not None:
            md.sampled = SampledRows(stage(md.sampled.rows), stage(md.sampled.query_start_loc))
        inputs.input_ids = stage(inputs.input_ids)
        inputs.logits_indices = stage(inputs.logits_indices)
        if self.ops.backend == "reference":  # host data: the plan reads it without a device sync
            md.plan = plan_attention(*host, self.block_size, self.dtype, self.device)
        return inputs

    def _largest_step(self) -> tuple[StepInputs, KVCache, list[int]]:
        """The largest step's inputs (on the device), a scratch KV cache for it, and its lengths."""
        from bulkrun.engine.core.params import SamplingParams
        from bulkrun.engine.core.request import Request
        from bulkrun.engine.core.scheduler import SchedulerOutput
        from bulkrun.engine.core.scoring import ScoringState

        bs = self.block_size
        lengths = memory_profile.profile_step_lengths(self.limits.max_num_batched_tokens, self.max_model_len)
        blocks = [-(-n // bs) for n in lengths]
        scratch = KVCache(self.model.cfg, sum(blocks), bs, self.dtype, self.device)
        scheduled, first = [], 0
        for i, (n, b) in enumerate(zip(lengths, blocks, strict=True)):
            table = list(range(first, first + b))
            r = Request(f"profile{i}", SamplingParams(), [3] * n, n, block_table=table)
            r.scoring = ScoringState(score_start=1)  # every row but the last scores the next token
            scheduled.append((r, n, False))
            first += b
        inputs = self._to_device(self.builder.build(SchedulerOutput(scheduled), pending={}))
        return inputs, scratch, lengths

    @torch.inference_mode()
    def _profile_activation_bytes(self) -> int:
        """Peak extra device memory of the largest step (memory_profile): the full token budget in
        as many sequences as the context makes it take, built through a RunningBatch as every step
        is, every row scored, then the sampler on the most rows that sample in a step (a top-p row
        sorts its whole vocabulary on a GPU). Never below the estimate from the shapes."""
        from bulkrun.engine.core.params import SamplingParams

        cfg, budget = self.model.cfg, self.limits.max_num_batched_tokens
        inputs, scratch, lengths = self._largest_step()
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        h = self.model.final_hidden(inputs.input_ids, inputs.metadata, scratch.layers, inputs.logits_indices)
        logits = self.model.logits(h)
        scores = score_logprobs(inputs.scores, logits, 0, self.staging.to_device)
        rows = max(1, min(self.limits.max_num_seqs, logits.shape[0]))
        nucleus = SamplingParams(temperature=1.0, top_p=0.9, seed=0)
        drawn = self.sampler(logits[:rows].float(), [nucleus] * rows, [0] * rows)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del scratch, logits, inputs, h, scores, drawn
        torch.cuda.empty_cache()
        shape = memory_profile.ModelShape(
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.intermediate_size,
            cfg.vocab_size,
        )
        estimate = memory_profile.largest_step_bytes(shape, budget, rows, self.dtype.itemsize)["total"]
        peak = max(peak, estimate)
        self.limits.profile_step = memory_profile.describe(lengths, rows, peak)
        log.info("memory profile: %s", self.limits.profile_step)
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


def _cpu_kv_cache_before_load(model_dir: str, config: EngineConfig) -> tuple[KVCache, int] | None:
    """On the CPU, the KV cache (and its budget) made before the model loads: its size is a share of
    memory and its shape the model's config, so the blocks of a job's first PREMAP_STEPS full steps
    are mapped on a thread while the weights load and pack (~0.7 s that leave a core idle), instead
    of inside those steps. None on other devices (their budget is what the loaded model leaves), or
    where the model is loaded already (no load to overlap)."""
    if loaded_model.is_loaded(model_dir, config):
        return None
    device, dtype = loaded_model.planned_device_dtype(config)
    if device.type != "cpu":
        return None
    budget = _set_or_cpu_kv_budget(config)
    cfg = ModelConfig.from_model_dir(model_dir)
    cache = KVCache.from_budget(cfg, budget, config.block_size, dtype, device)
    cache.premap(PREMAP_STEPS * choose_limits(config, "cpu").max_num_batched_tokens)
    return cache, budget


def _set_or_cpu_kv_budget(config: EngineConfig) -> int:
    """The KV cache bytes the config sets, else the CPU's default share of memory."""
    return config.kv_cache_bytes if config.kv_cache_bytes is not None else default_cpu_kv_bytes()


def _rows_from(h: torch.Tensor, rest: list[int], n: int, stage) -> torch.Tensor:
    """h's sample rows `rest` (in order), then all of its rows past the n sample rows."""
    keep = np.concatenate([np.asarray(rest, np.int64), np.arange(n, h.shape[0], dtype=np.int64)])
    return h.index_select(0, stage(keep))


def _fill_sampled_logprobs(request_ids: list[str]):
    def fill(values: np.ndarray, result: RunnerOutput) -> None:
        result.sampled_logprobs.update(zip(request_ids, values.tolist(), strict=True))

    return fill


class StepHandle:
    """A launched step: result() waits for its sampled tokens (and whatever else the step reads
    back) and returns the RunnerOutput."""

    def __init__(self, result: RunnerOutput, requests: list = (), staging: Staging | None = None):
        self._result, self._requests, self._staging = result, requests, staging
        self._tokens: torch.Tensor | None = None
        self._reads: list[tuple[torch.Tensor, Callable]] = []
        self._event = None

    def read_back(self, values: torch.Tensor, fill: Callable[[np.ndarray, RunnerOutput], None]) -> None:
        """Copy `values` back without waiting; fill(host values, output) runs in result()."""
        self._reads.append((self._staging.to_host(values), fill))

    def launched(self, tokens: torch.Tensor) -> None:
        """The step's last work is queued: copy its tokens back, and mark when all has landed."""
        self._tokens = self._staging.to_host(tokens)
        if self._staging.pinned:
            self._event = torch.cuda.Event()
            self._event.record()

    def result(self, by_request_id: bool = False) -> RunnerOutput:
        """The step's output, its tokens in sample-row order (what the scheduler reads); with
        `by_request_id` also keyed by request id (a dict of every row: for callers that want it)."""
        if self._tokens is not None:
            if self._event is not None:
                self._event.synchronize()
            self._result.sampled_tokens = self._tokens.numpy()  # host memory (pinned on CUDA)
            for values, fill in self._reads:
                fill(values.numpy(), self._result)
            self._tokens, self._reads = None, []
        if by_request_id and self._result.sampled_tokens is not None and not self._result.sampled:
            ids = map(_request_id, self._requests)
            self._result.sampled = dict(zip(ids, self._result.sampled_tokens.tolist(), strict=True))
        return self._result


def _fill_expert_tokens(values, result: RunnerOutput) -> None:
    result.expert_tokens = tuple(values.tolist())
