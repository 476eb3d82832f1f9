"""The model runner: owns the model, the KV cache and the sampler; executes one scheduled step."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from bulkrun.engine.config import EngineConfig
from bulkrun.engine.cpu_env import keep_freed_memory
from bulkrun.engine.device import resolve_device
from bulkrun.engine.kv_cache import KVCache, default_cpu_kv_bytes, default_cuda_kv_bytes
from bulkrun.engine.runner_output import RunnerOutput
from bulkrun.engine.sampler import Sampler
from bulkrun.engine.scheduler import SchedulerOutput
from bulkrun.engine.step_inputs import StepInputs, build_step_inputs
from bulkrun.model.greedy_head import build_greedy_head
from bulkrun.model.linear import pack_linears_for_cpu
from bulkrun.model.loader import load_model
from bulkrun_kernels import get_ops
from bulkrun_kernels.reference import plan_attention

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device_dtype(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    device = resolve_device(config.device)
    name = config.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {name!r}")
    return device, _DTYPES[name]


class ModelRunner:
    def __init__(self, model_dir: str, config: EngineConfig):
        self.config = config
        self.device, self.dtype = resolve_device_dtype(config)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.ops = get_ops(config.kernels, self.device)
        self.model = load_model(model_dir, self.ops, self.dtype, self.device)
        # greedy rows without logprobs: exact argmax from a bf16 screen (None where that is not faster)
        self.greedy_head = build_greedy_head(self.model, self.device, self.dtype, self.ops.backend)
        self.onednn = self.device.type == "cpu" and pack_linears_for_cpu(self.model)
        cfg = self.model.cfg
        self.vocab_size = cfg.vocab_size
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.max_model_len = min(cfg.max_model_len, config.max_model_len or cfg.max_model_len)
        self.eos_token_ids = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.block_size = config.block_size
        self.kv_cache = KVCache.from_budget(cfg, self._kv_budget(), self.block_size, self.dtype, self.device)
        self.num_blocks = self.kv_cache.num_blocks
        self.sampler = Sampler()

    def _kv_budget(self) -> int:
        if self.config.kv_cache_bytes is not None:
            return self.config.kv_cache_bytes
        if self.device.type != "cuda":
            return default_cpu_kv_bytes()
        return default_cuda_kv_bytes(self.device, self._profile_activation_bytes())

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        result = RunnerOutput()
        if not out.scheduled:
            return result
        inputs = self._to_device(build_step_inputs(out.scheduled, self.block_size))
        h = self.model.final_hidden(
            inputs.input_ids, inputs.metadata, self.kv_cache.layers, inputs.logits_indices
        )
        screened = self._screened_rows(inputs)
        tokens = self.greedy_head(h[screened]).tolist() if screened else []
        logits = self.model.logits(_without_rows(h, screened))  # every other row, in order
        self._sample(inputs, logits, dict(zip(screened, tokens, strict=True)), result)
        self._score(inputs, logits, len(screened), result)
        self._score_first_tokens(inputs, logits, result)
        return result

    def _screened_rows(self, inputs: StepInputs) -> list[int]:
        """The sample rows the greedy head answers: greedy and no log-probability asked."""
        if self.greedy_head is None:
            return []
        return [i for i, r in enumerate(inputs.sample_requests) if r.params.greedy and not r.params.logprobs]

    def _to_device(self, inputs: StepInputs) -> StepInputs:
        md = inputs.metadata
        query_start_loc, seq_lens = md.query_start_loc, md.seq_lens  # host copies for the plan
        if self.device.type != "cpu":
            for name in ("positions", "slot_mapping", "block_tables", "query_start_loc", "seq_lens"):
                setattr(md, name, getattr(md, name).to(self.device, non_blocking=True))
            inputs.input_ids = inputs.input_ids.to(self.device, non_blocking=True)
            inputs.logits_indices = inputs.logits_indices.to(self.device, non_blocking=True)
        if self.ops.backend == "reference":
            md.plan = plan_attention(md.block_tables, query_start_loc, seq_lens, self.block_size, self.dtype)
        return inputs

    def _sample(
        self, inputs: StepInputs, logits: torch.Tensor, screened: dict[int, int], result: RunnerOutput
    ) -> None:
        """screened: sample row -> the greedy head's token; the other sample rows are logits' first rows."""
        requests = inputs.sample_requests
        rest = [i for i in range(len(requests)) if i not in screened]
        tokens, logprobs = dict(screened), {}
        if rest:
            params = [requests[i].params for i in rest]
            output_indices = [requests[i].num_output_tokens for i in rest]
            drawn, row_logprobs = self.sampler(logits[: len(rest)], params, output_indices)
            tokens.update(zip(rest, drawn, strict=True))
            logprobs = {rest[j]: value for j, value in row_logprobs.items()}
        for i, r in enumerate(requests):
            result.sampled[r.request_id] = tokens[i]
            if i in logprobs:
                result.sampled_logprobs[r.request_id] = logprobs[i]

    def _score(self, inputs: StepInputs, logits: torch.Tensor, screened: int, result: RunnerOutput) -> None:
        spans = inputs.score_spans
        if not spans:
            return
        first = spans[0].first_row
        targets = torch.tensor([t for s in spans for t in s.targets], device=logits.device)
        at = first - screened  # the screened rows precede every scoring row and have no logits
        rows = logits[at : at + len(targets)].log_softmax(dim=-1)
        values = rows.gather(1, targets[:, None]).squeeze(1).tolist()
        for s in spans:
            start = s.first_row - first
            result.score_logprobs[s.request.request_id] = values[start : start + len(s.targets)]

    def _score_first_tokens(self, inputs: StepInputs, logits: torch.Tensor, result: RunnerOutput) -> None:
        """One log_softmax row per scoring parent (its last prompt row), K gathers from it."""
        requests = inputs.first_token_requests
        if not requests:
            return
        first = logits.shape[0] - len(requests)
        rows = logits[first:].float().log_softmax(dim=-1)
        row_index = [i for i, r in enumerate(requests) for _ in r.first_token_ids]
        tokens = [t for r in requests for t in r.first_token_ids]
        index = torch.tensor(row_index, device=logits.device), torch.tensor(tokens, device=logits.device)
        values = rows[index].tolist()
        start = 0
        for r in requests:
            end = start + len(r.first_token_ids)
            result.first_token_logprobs[r.request_id] = values[start:end]
            start = end

    @torch.inference_mode()
    def _profile_activation_bytes(self) -> int:
        """Peak extra device memory of a step at the full token budget (as one prompt chunk)."""
        from bulkrun.engine.params import SamplingParams
        from bulkrun.engine.request import Request
        from bulkrun.engine.scheduler import ScheduledRequest

        cfg = self.model.cfg
        tokens = max(1, min(self.config.max_num_batched_tokens, self.max_model_len))
        num_blocks = -(-tokens // self.block_size)
        scratch = KVCache(cfg, num_blocks, self.block_size, self.dtype, self.device)
        request = Request(
            "profile", SamplingParams(), [0] * tokens, tokens, arrival=0, block_table=list(range(num_blocks))
        )
        inputs = self._to_device(
            build_step_inputs([ScheduledRequest(request, tokens, False)], self.block_size)
        )
        rows = min(tokens, self.config.max_num_seqs)
        inputs.logits_indices = torch.arange(tokens - rows, tokens, device=self.device)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        logits = self.model(inputs.input_ids, inputs.metadata, scratch.layers, inputs.logits_indices)
        logits.log_softmax(dim=-1)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del scratch, logits, inputs
        torch.cuda.empty_cache()
        return peak


def _without_rows(h: torch.Tensor, rows: list[int]) -> torch.Tensor:
    if not rows:
        return h
    keep = torch.ones(h.shape[0], dtype=torch.bool, device=h.device)
    keep[rows] = False
    return h[keep]
