"""RunStats: the figures of one run (or of many slices, merged), and the reports made from them.

One typed object gathers what the engine steps and the finished outputs tell (the bar, progress
files, report.json and the end-of-job summary all read it). Slices (Ray workers, --shard runs) each
keep their own; `RunStats.merge` adds them field by field, so nothing is guessed from key names.
report.json is flat: this run's figures (`summary()`) next to the job's totals read back from the
committed shards (rows, done, results_total, errors_total, remaining, complete).
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import asdict, dataclass, field, fields

from bulkrun.engine.core.outputs import RequestOutput, StepStats


@dataclass
class RunStats:
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
    kv_touched: float = 0.0  # the fraction of the KV cache ever handed out (its memory in use)
    preemptions: int = 0
    kv_cache_bytes: int = 0  # the KV cache's budget (its peak use is kv_peak of it)
    peak_rss_bytes: int = 0  # the process's peak resident memory, taken by finish()
    dtype: str | None = None  # what the model computed in, and why
    dtype_reason: str | None = None
    batch_invariant: bool | None = None  # the kernels ran with a fixed per-row reduction order
    wall_s: float | None = None  # fixed by finish() or merge(); a live run measures from `started`
    started: float = field(default_factory=time.time)

    def describe_engine(self, engine) -> None:
        self.dtype = getattr(engine, "dtype", None)
        self.dtype_reason = getattr(engine, "dtype_reason", None)
        self.batch_invariant = getattr(engine, "batch_invariant", None)
        limits = getattr(engine, "limits", None)
        self.kv_cache_bytes = getattr(limits, "kv_cache_bytes", None) or 0

    def on_step(self, stats: StepStats) -> None:
        self.steps += 1
        self.scheduled_tokens += stats.num_scheduled_tokens
        self.running_sum += stats.num_running
        self.preemptions += stats.num_preempted
        if stats.kv_blocks_total:
            used = stats.kv_blocks_used / stats.kv_blocks_total
            self.kv_used_sum += used
            self.kv_peak = max(self.kv_peak, used)
            self.kv_touched = max(self.kv_touched, stats.kv_blocks_touched / stats.kv_blocks_total)

    def on_output(self, output: RequestOutput) -> None:
        self.requests += 1
        self.prompt_tokens += len(output.prompt_token_ids)
        self.cached_prompt_tokens += output.num_cached_tokens
        self.generated_tokens += len(output.output_token_ids)

    def finish(self) -> RunStats:
        self.wall_s = time.time() - self.started
        self.peak_rss_bytes = peak_rss_bytes()
        return self

    @property
    def elapsed_s(self) -> float:
        return self.wall_s if self.wall_s is not None else time.time() - self.started

    @classmethod
    def merge(cls, parts: list[RunStats], wall_s: float | None = None) -> RunStats:
        """Slices' figures as one run: counts and sums add up, the KV peak is the highest. The wall
        time is `wall_s` (the whole job's processing time, as the Ray driver measures it), else the
        longest slice's (slices of a job array run side by side)."""
        merged = cls(started=min((p.started for p in parts), default=time.time()))
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            if f.name in _HIGHEST:
                setattr(merged, f.name, max(values, default=0))
            elif f.name in _SHARED:  # every slice runs the same engine set-up
                setattr(merged, f.name, next((v for v in values if v is not None), None))
            elif f.name not in ("wall_s", "started"):
                setattr(merged, f.name, sum(values))
        merged.wall_s = wall_s if wall_s is not None else max((p.elapsed_s for p in parts), default=0.0)
        return merged

    def to_dict(self) -> dict:
        return asdict(self) | {"wall_s": self.elapsed_s}

    @classmethod
    def from_dict(cls, data: dict) -> RunStats:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def summary(self) -> dict:
        """The run's figures as report.json shows them."""
        wall = max(self.elapsed_s, 1e-9)
        steps = max(self.steps, 1)
        return {
            "items": self.items,
            "errors": self.errors,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "wall_time_s": round(self.elapsed_s, 3),
            "items_per_s": round((self.items + self.errors) / wall, 3),
            "generated_tokens_per_s": round(self.generated_tokens / wall, 2),
            "total_tokens_per_s": round((self.prompt_tokens + self.generated_tokens) / wall, 2),
            "engine_steps": self.steps,
            "mean_running_batch": round(self.running_sum / steps, 2),
            "kv_cache_use_mean": round(self.kv_used_sum / steps, 4),
            "kv_cache_use_peak": round(self.kv_peak, 4),
            "prefix_cache_hit_rate": round(self.cached_prompt_tokens / max(self.prompt_tokens, 1), 4),
            "preemptions": self.preemptions,
            "kv_cache_mb": round(self.kv_cache_bytes / 2**20, 1),
            "kv_cache_peak_mb": round(self.kv_peak * self.kv_cache_bytes / 2**20, 1),
            "kv_cache_touched_mb": round(self.kv_touched * self.kv_cache_bytes / 2**20, 1),
            "peak_rss_mb": round(self.peak_rss_bytes / 2**20, 1),
            "dtype": self.dtype,
            "dtype_reason": self.dtype_reason,
            "batch_invariant": self.batch_invariant,
        }


_HIGHEST = ("kv_peak", "kv_touched", "kv_cache_bytes", "peak_rss_bytes")  # merged: the highest slice's
_SHARED = ("dtype", "dtype_reason", "batch_invariant")


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def summary_lines(report: dict) -> list[str]:
    """The few lines printed on stderr at the end of a job command."""
    rows = report.get("rows")
    if report.get("complete"):
        state = "done"
    elif report.get("remaining") is not None:
        state = f"stopped with {report['remaining']} of {rows} rows remaining"
    else:
        state = "slice done"
    lines = [f"bulkrun {report.get('task', '')}: {state} -> {report.get('out')}"]
    if "results_total" in report:
        errors = report["errors_total"]
        where = f" (see {_errors_file(report)})" if errors else ""
        lines.append(f"  rows {rows}: {report['results_total']} results, {errors} errors{where}")
    lines.append(
        f"  this run: {report.get('items', 0)} items + {report.get('errors', 0)} errors in "
        f"{report.get('wall_time_s', 0):.1f}s ({report.get('items_per_s', 0):.2f} items/s), "
        f"{report.get('prompt_tokens', 0)} prompt + {report.get('generated_tokens', 0)} generated tokens "
        f"({report.get('total_tokens_per_s', 0):.0f} tok/s)"
    )
    if "mean_running_batch" in report:
        lines.append(
            f"  engine: mean batch {report['mean_running_batch']}, KV use {report['kv_cache_use_mean']:.0%} "
            f"(peak {report['kv_cache_use_peak']:.0%}), prefix-cache hits {report['prefix_cache_hit_rate']:.0%}"
            f", peak RSS {report.get('peak_rss_mb', 0):.0f} MB, {report.get('dtype') or 'dtype n/a'}"
        )
    # the task's metrics.json as text: accuracy, per-label figures, calibration, confusion matrix
    from bulkrun.tasks.metrics import metrics_lines

    lines += [f"  {line}" for line in metrics_lines(report.get("metrics") or {})]
    return lines


def _errors_file(report: dict) -> str:
    names = [f for f in report.get("files") or [] if f.startswith("errors.")]
    return names[0] if names else "errors/"
