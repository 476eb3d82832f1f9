"""Task names to Task classes, imported lazily so `bulkrun status` never imports a model stack."""

from __future__ import annotations

import importlib

from bulkrun.errors import UsageError
from bulkrun.tasks.base import Task

_TASKS: dict[str, str | type[Task]] = {
    "generate": "bulkrun.tasks.generate:GenerateTask",
    "summarize": "bulkrun.tasks.summarize:SummarizeTask",
    "classify": "bulkrun.tasks.classify:ClassifyTask",
    "eval": "bulkrun.tasks.eval:EvalTask",
}


def register_task(name: str, task: str | type[Task]) -> None:
    """Add or replace a task: a Task subclass or a "module:Class" path."""
    _TASKS[name] = task


def task_names() -> list[str]:
    return sorted(_TASKS)


def task_class(name: str) -> type[Task]:
    if name not in _TASKS:
        raise UsageError(f"unknown task '{name}' (known: {', '.join(task_names())})")
    entry = _TASKS[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        try:
            entry = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"task '{name}' is not available: {exc}") from None
        _TASKS[name] = entry
    return entry
