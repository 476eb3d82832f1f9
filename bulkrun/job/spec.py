"""JobSpec: every option of a job, from a TOML file, the command line, or both (flags win).

A TOML spec is flat: the same names as the command-line options, with `_` or `-`:

    task = "classify"
    input = "bulkrun/data/tickets.jsonl"
    out = "runs/tickets"
    labels = ["billing", "bug", "feature"]
    temperature = 0.0

Keys are the shared ones below plus the task's own (Task.options). An unknown key is an error
naming the key. Relative paths are relative to the current directory, like on the command line.

Adding an option: a field on JobSpec (shared) or a key in a Task's `options` (task-specific), its
typed alias in bulkrun/cli/options.py, and a parameter of that name in each command that takes it.
Adding a task: a Task subclass and a line in _TASKS below.
Task classes are imported lazily, so `bulkrun status` never imports a model stack.
"""

from __future__ import annotations

import difflib
import importlib
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from bulkrun.engine.core.params import SamplingParams
from bulkrun.exceptions import SpecError, UsageError
from bulkrun.tasks.base import Task

RESULT = {"result": True}  # the option changes results: it is part of the job fingerprint


@dataclass
class JobSpec:
    task: str = field(default="generate", metadata=RESULT)
    input: str | None = None
    out: str | None = None
    model: str | None = None  # fingerprinted separately (by the model's content, not its name)
    # rows and prompts
    id_field: str | None = field(default=None, metadata=RESULT)
    text_field: str = field(default="text", metadata=RESULT)
    prompt_template: str | None = field(default=None, metadata=RESULT)
    system: str | None = field(default=None, metadata=RESULT)
    chat_template: bool = field(default=True, metadata=RESULT)
    # options passed to the chat template (e.g. {"enable_thinking": false}); a JSON object on the CLI
    chat_template_kwargs: dict = field(default_factory=dict, metadata=RESULT)
    messages_field: str | None = field(default=None, metadata=RESULT)
    # constrained generation (job/constraints.py, tasks/constraints.py)
    json_schema: str | None = field(default=None, metadata=RESULT)
    regex: str | None = field(default=None, metadata=RESULT)
    choice: list[str] = field(default_factory=list, metadata=RESULT)
    schema_field: str | None = field(default=None, metadata=RESULT)
    # sampling
    temperature: float = field(default=0.0, metadata=RESULT)
    top_k: int = field(default=0, metadata=RESULT)
    top_p: float = field(default=1.0, metadata=RESULT)
    min_p: float = field(default=0.0, metadata=RESULT)
    max_tokens: int = field(default=64, metadata=RESULT)
    seed: int = field(default=0, metadata=RESULT)
    stop: list[str] = field(default_factory=list, metadata=RESULT)
    n: int = field(default=1, metadata=RESULT)
    max_model_len: int | None = field(default=None, metadata=RESULT)
    dtype: str | None = field(default=None, metadata=RESULT)
    batch_invariant: bool = field(default=True, metadata=RESULT)
    # job mechanics (do not change results)
    window: int = 256
    sort_by_length: bool = True
    checkpoint_every: str = "1000,60s"
    quiet: bool = False
    restart: bool = False
    keep_fields: list[str] = field(default_factory=list)
    # engine knobs (do not change results), named as EngineConfig's fields
    kv_cache_bytes: str | None = None  # a size: 2GiB, 512MB or a number of bytes
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enable_prefix_caching: bool = True
    kernels: str = "auto"
    device: str | None = None
    cuda_graphs: bool = True
    # distribution (bulkrun.distributed)
    ray: str | None = None
    workers: int | None = None
    shard: str | None = None
    # the task's own options (Task.options keys)
    task_options: dict = field(default_factory=dict)

    def sampling(self) -> SamplingParams:
        try:
            return SamplingParams(
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                top_k=self.top_k,
                top_p=self.top_p,
                min_p=self.min_p,
                seed=self.seed,
                stop=tuple(self.stop),
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def engine_config(self):
        """The EngineConfig of this job (its checks, e.g. the kernel backend's name, are the engine's)."""
        from bulkrun.engine.core.config import EngineConfig

        values = {
            "kv_cache_bytes": parse_size(self.kv_cache_bytes) if self.kv_cache_bytes else None,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_prefix_caching": self.enable_prefix_caching,
            "dtype": self.dtype,
            "device": self.device,
            "kernels": self.kernels,
            "max_model_len": self.max_model_len,
            "cuda_graphs": self.cuda_graphs,
            "batch_invariant": self.batch_invariant,
        }
        try:
            return EngineConfig(**{k: v for k, v in values.items() if v is not None})
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def result_options(self, task: type[Task]) -> dict:
        """The options that change results: what the manifest fingerprints."""
        chosen = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("result")}
        cosmetic = task.cosmetic_options
        chosen.update({k: v for k, v in sorted(self.task_options.items()) if k not in cosmetic})
        if self.json_schema:  # the schema itself, not only its file name
            from bulkrun.job.constraints import read_schema_file

            chosen["json_schema"] = [self.json_schema, read_schema_file(self.json_schema)]
        return chosen


SHARED_KEYS = {f.name: f for f in fields(JobSpec) if f.name != "task_options"}


def normalize_key(key: str) -> str:
    return key.replace("-", "_")


def load_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(f"job spec '{path}' does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"job spec '{path}' is not valid TOML: {exc}") from None
    except OSError as exc:
        raise SpecError(f"job spec '{path}' cannot be read: {exc.strerror or exc}") from None
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and normalize_key(key) not in _DICT_KEYS_OK:
            raise SpecError(f"job spec '{path}': key '{key}' is a table; spec keys are flat (key = value)")
        out[normalize_key(key)] = value
    return out


_DICT_KEYS_OK = {"label_descriptions", "chat_template_kwargs"}


def build_spec(layers: list[tuple[str, dict]]) -> JobSpec:
    """Merge option layers, later ones winning (e.g. [("task defaults", ...), ("spec x.toml", ...),
    ("command line", ...)]); None values are "not given". Validates every key and value."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source, values in layers:
        for key, value in values.items():
            if value is not None:
                merged[normalize_key(key)] = value
                origin[normalize_key(key)] = source
    task = task_class(str(merged.get("task", JobSpec.task)))
    task_defaults = getattr(task, "default_overrides", {})
    spec_values: dict[str, Any] = {}
    task_values: dict[str, Any] = dict(task.options)
    for key, value in merged.items():
        where = origin[key]
        if key in SHARED_KEYS:
            spec_values[key] = check_value(key, value, SHARED_KEYS[key].type, where)
        elif key in task.options:
            task_values[key] = value
        else:
            raise SpecError(_unknown_key_message(key, where, task))
    for key, value in task_defaults.items():
        spec_values.setdefault(key, value)
    spec = JobSpec(**spec_values, task_options=task_values)
    from bulkrun.job.validate import check_spec  # it checks values with this module's parsers

    check_spec(spec)
    if spec.out is None:  # the one place the default output directory is chosen
        spec.out = str(Path("runs") / f"{spec.task}-{Path(spec.input).stem}")
    return spec


def _unknown_key_message(key: str, where: str, task: type[Task]) -> str:
    known = list(SHARED_KEYS) + list(task.options)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown option '{key}' in {where} for task '{task.name}'{hint}"


def spec_from_file(path: Path, overrides: dict | None = None) -> JobSpec:
    """A spec file with command-line overrides on top (flags win over the file)."""
    return build_spec([(f"job spec '{path}'", load_toml(path)), ("the command line", overrides or {})])


# ---- tasks by name ----------------------------------------------------------------------------

_TASKS: dict[str, str | type[Task]] = {
    "generate": "bulkrun.tasks.generate:GenerateTask",
    "summarize": "bulkrun.tasks.summarize:SummarizeTask",
    "classify": "bulkrun.tasks.classify:ClassifyTask",
    "eval": "bulkrun.tasks.eval:EvalTask",
    "embed": "bulkrun.tasks.embed:EmbedTask",
}


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


# ---- option values ------------------------------------------------------------------------------
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def check_value(key: str, value: Any, annotation: str, where: str) -> Any:
    """Check a spec value against its field annotation (e.g. "int | None", "list[str]")."""
    kinds = [part.strip() for part in str(annotation).split("|")]
    if "None" in kinds and value is None:
        return None
    if "bool" in kinds and isinstance(value, bool):
        return value
    if "int" in kinds and isinstance(value, int) and not isinstance(value, bool):
        return value
    if "float" in kinds and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if "str" in kinds and isinstance(value, str):
        return value
    if "str" in kinds and key in ("checkpoint_every", "kv_cache_bytes") and isinstance(value, int):
        return str(value)  # a bare number of items / bytes
    if "dict" in kinds:
        if isinstance(value, str):  # the CLI's JSON
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise UsageError(f"option '{key}' in {where} must be a JSON object: {exc}") from None
        if isinstance(value, dict):
            return value
    if "list[str]" in kinds:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return list(value)
    wanted = " or ".join(k for k in kinds if k != "None")
    raise UsageError(f"option '{key}' in {where} must be {wanted}, got {value!r}")


def parse_size(text: str | int) -> int:
    """Bytes from "4GiB", "512MB", "2g" or a plain number."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and match[2].lower()
    if not match or unit not in _SIZE_UNITS:
        raise UsageError(f"invalid size {text!r} (use e.g. 4GiB, 512MiB or a number of bytes)")
    size = int(float(match[1]) * _SIZE_UNITS[unit])
    if size <= 0:
        raise UsageError(f"size must be positive, got {text!r}")
    return size


def parse_checkpoint(text: str | int) -> tuple[int | None, float | None]:
    """(items, seconds) from "500", "60s", "5m" or "500,60s": commit at whichever comes first."""
    items, seconds = None, None
    for part in str(text).split(","):
        part = part.strip().lower()
        if re.fullmatch(r"\d+", part):
            items = int(part)
        elif re.fullmatch(r"\d+(\.\d+)?[smh]", part):
            seconds = float(part[:-1]) * _DURATION_UNITS[part[-1]]
        else:
            raise UsageError(f"invalid --checkpoint-every {text!r} (use e.g. 500, 60s, or 500,60s)")
    if (items is not None and items < 1) or (seconds is not None and seconds <= 0):
        raise UsageError(f"--checkpoint-every must be positive, got {text!r}")
    return items, seconds
