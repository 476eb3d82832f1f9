"""`bulkrun status OUT`: how far a job is, read from the committed shards (the truth), the lock
files (is a run alive?) and the progress files (throughput of the current or last run)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bulkrun.errors import InputError
from bulkrun.io.lock import is_live, read_lock
from bulkrun.io.manifest import read_manifest
from bulkrun.job.resume import load_committed


def job_status(out: Path) -> dict:
    manifest = read_manifest(out) if out.is_dir() else None
    if manifest is None:
        raise InputError(f"'{out}' holds no bulkrun job (no manifest.json)")
    committed = load_committed(out)
    rows = manifest["input"]["rows"]
    runs = _progress(out)
    live = [h for h in _locks(out) if is_live(h)]
    remaining = max(rows - len(committed.done), 0)
    state = "running" if live else "finished" if remaining == 0 else "stopped"
    return {
        "out": str(out),
        "task": manifest["spec"].get("task"),
        "input": manifest["input"]["path"],
        "model": manifest["model"].get("ref"),
        "state": state,
        "rows": rows,
        "done": len(committed.done),
        "results": committed.results,
        "errors": committed.errors,
        "remaining": remaining,
        "running": [{"pid": h.get("pid"), "host": h.get("hostname")} for h in live],
        "runs": runs,
        "items_per_s": round(sum(r.get("items_per_s", 0) for r in runs if r["live"] or len(runs) == 1), 3),
        "slices": _slices(out),
    }


def _locks(out: Path) -> list[dict]:
    holders = []
    for path in sorted(out.glob("lock*")):
        holder = read_lock(path)
        if holder is not None:
            holders.append(holder)
    return holders


def _progress(out: Path) -> list[dict]:
    runs = []
    for path in sorted((out / "progress").glob("*.json")):
        try:
            figures = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        age = time.time() - path.stat().st_mtime
        figures["writer"] = path.stem
        figures["live"] = age < 300  # a live run checkpoints far more often
        runs.append(figures)
    return runs


def _slices(out: Path) -> dict | None:
    from bulkrun.job.slices import read_slice_markers

    markers = read_slice_markers(str(out))
    if not markers:
        return None
    count = max(p.count for p in markers)
    done = sorted(p.index for p in markers if p.count == count)
    return {"count": count, "done": done, "missing": [k for k in range(count) if k not in done]}


def status_lines(info: dict) -> list[str]:
    lines = [
        f"{info['out']}: {info['task']} on {info['input']} (model {info['model']}) - {info['state']}",
        f"  rows {info['rows']}: done {info['done']} ({info['results']} results, {info['errors']} errors), "
        f"remaining {info['remaining']}",
    ]
    for run in info["running"]:
        lines.append(f"  running: pid {run['pid']} on {run['host']}")
    for run in info["runs"]:
        lines.append(
            f"  {'current' if run['live'] else 'last'} run ({run['writer']}): {run.get('items', 0)} items + "
            f"{run.get('errors', 0)} errors in {run.get('wall_time_s', 0):.0f}s, "
            f"{run.get('items_per_s', 0):.2f} items/s, {run.get('total_tokens_per_s', 0):.0f} tok/s"
        )
    slices = info.get("slices")
    if slices:
        missing = ", ".join(f"{k}/{slices['count']}" for k in slices["missing"]) or "none"
        lines.append(f"  slices: {len(slices['done'])} of {slices['count']} done; not done: {missing}")
    return lines
