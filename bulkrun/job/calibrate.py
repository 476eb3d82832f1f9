"""Scoring a task's content-free prompts before any item (contextual calibration, tasks/calibration.py).

A task that calibrates (classify, classify-style eval) hands over its content-free prompts; they go
through the same PromptBuilder as the items (chat template, --system, the answer prefix), so the prior
is that of the very prompt the items get. Every process of a job (a resumed run, a --shard slice, a
Ray worker) scores them itself: a few requests, deterministic, so every one finds the same prior.
"""

from __future__ import annotations

from bulkrun.exceptions import UsageError
from bulkrun.job.feed import PromptBuilder
from bulkrun.tasks.base import Item, Task


def calibrate_task(task: Task, builder: PromptBuilder, engine) -> None:
    prompts_of = getattr(task, "content_free_prompts", None)
    prompts = prompts_of() if prompts_of is not None else []
    if not prompts:
        return
    items = [Item(-1 - k, f"content-free-{k}", {}) for k in range(len(prompts))]
    prepared, errors = builder.prepare_rendered(list(zip(items, prompts, strict=True)), [], sort=False)
    if errors:
        raise UsageError(f"content-free calibration prompt cannot be scored: {errors[0]['message']}")
    requests = []
    for k, one in enumerate(prepared):
        for request in one.requests:
            request.request_id = f"content-free/{k}"
            requests.append(request)
    by_id = {output.request_id: output for output in engine.stream(requests)}  # the engine's one loop
    try:
        task.set_content_free([by_id[request.request_id] for request in requests])
    except ValueError as exc:  # CalibrationError: e.g. a label the prompt can never produce
        raise UsageError(f"content-free calibration failed: {exc}") from None
