"""report.json and the short human summary printed at the end of a job.

The report is flat so that the reports of slices (Ray workers, --shard runs) merge key by key:
this run's figures (items, errors, tokens, throughput, engine figures) next to the job's totals
(rows, done, results_total, errors_total, remaining, complete) read back from the committed shards.
"""

from __future__ import annotations

from pathlib import Path

from bulkrun.io.atomic import write_json_atomic
from bulkrun.job.resume import load_committed
from bulkrun.job.stats import RunStats


def run_report(session, stats: RunStats) -> dict:
    return {
        "task": session.spec.task,
        "out": str(session.out),
        "model": session.manifest["model"].get("ref") or "default",
        **stats.summary(),
    }


def job_figures(session) -> dict:
    committed = load_committed(session.out)
    rows = session.total_rows
    remaining = max(rows - len(committed.done), 0)
    return {
        "rows": rows,
        "done": len(committed.done),
        "results_total": committed.results,
        "errors_total": committed.errors,
        "remaining": remaining,
        "complete": remaining == 0,
        "files": [],
        "metrics": None,
    }


def write_report(out: Path, report: dict, name: str = "report.json") -> Path:
    path = out / name
    write_json_atomic(path, report)
    return path


def summary_lines(report: dict) -> list[str]:
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
        )
    metrics = report.get("metrics") or {}
    if isinstance(metrics.get("accuracy"), int | float):
        lines.append(f"  accuracy {metrics['accuracy']:.3f}")
    return lines


def _errors_file(report: dict) -> str:
    names = [f for f in report.get("files") or [] if f.startswith("errors.")]
    return names[0] if names else "errors/"
