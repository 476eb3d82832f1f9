"""Figures of one run, gathered from engine steps and finished outputs, for the bar and report.json."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bulkrun.engine.outputs import RequestOutput, StepStats


@dataclass
class RunStats:
    started: float = field(default_factory=time.time)
    items: int = 0  # result records this run
    errors: int = 0  # error records this run
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # served from the prefix cache
    generated_tokens: int = 0
    scheduled_tokens: int = 0
    steps: int = 0
    running_sum: int = 0  # sum over steps of running sequences (mean batch = running_sum / steps)
    kv_used_sum: float = 0.0  # sum over steps of the KV-cache fraction in use
    kv_peak: float = 0.0
    preemptions: int = 0

    def on_step(self, stats: StepStats) -> None:
        self.steps += 1
        self.scheduled_tokens += stats.num_scheduled_tokens
        self.running_sum += stats.num_running
        self.preemptions += stats.num_preempted
        if stats.kv_blocks_total:
            used = stats.kv_blocks_used / stats.kv_blocks_total
            self.kv_used_sum += used
            self.kv_peak = max(self.kv_peak, used)

    def on_output(self, output: RequestOutput) -> None:
        self.requests += 1
        self.prompt_tokens += len(output.prompt_token_ids)
        self.cached_prompt_tokens += output.num_cached_tokens
        self.generated_tokens += len(output.output_token_ids)

    @property
    def wall_s(self) -> float:
        return time.time() - self.started

    def summary(self) -> dict:
        wall = max(self.wall_s, 1e-9)
        steps = max(self.steps, 1)
        return {
            "items": self.items,
            "errors": self.errors,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "wall_time_s": round(self.wall_s, 3),
            "items_per_s": round((self.items + self.errors) / wall, 3),
            "generated_tokens_per_s": round(self.generated_tokens / wall, 2),
            "total_tokens_per_s": round((self.prompt_tokens + self.generated_tokens) / wall, 2),
            "engine_steps": self.steps,
            "mean_running_batch": round(self.running_sum / steps, 2),
            "kv_cache_use_mean": round(self.kv_used_sum / steps, 4),
            "kv_cache_use_peak": round(self.kv_peak, 4),
            "prefix_cache_hit_rate": round(self.cached_prompt_tokens / max(self.prompt_tokens, 1), 4),
            "preemptions": self.preemptions,
        }
