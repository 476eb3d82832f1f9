"""JobSpec: every option of a job, from a TOML file, the command line, or both (flags win).

A TOML spec is flat: the same names as the command-line options, with `_` or `-`:

    task = "classify"
    input = "bulkrun/data/tickets.jsonl"
    out = "runs/tickets"
    labels = ["billing", "bug", "feature"]
    temperature = 0.0

Keys are the shared ones below plus the task's own (Task.options). An unknown key is an error
naming the key. Relative paths are relative to the current directory, like on the command line.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from bulkrun.engine.params import SamplingParams
from bulkrun.errors import SpecError, UsageError
from bulkrun.job.registry import task_class
from bulkrun.job.values import check_value
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
    # job mechanics (do not change results)
    window: int = 256
    sort_by_length: bool = True
    checkpoint_every: str = "1000,60s"
    quiet: bool = False
    restart: bool = False
    keep_fields: list[str] = field(default_factory=list)
    # engine knobs (do not change results)
    kv_cache_mem: str | None = None
    max_batch_tokens: int | None = None
    max_seqs: int | None = None
    prefix_cache: bool = True
    kernels: str = "auto"
    device: str | None = None
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

    def result_options(self, task: type[Task]) -> dict:
        """The options that change results: what the manifest fingerprints."""
        chosen = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("result")}
        cosmetic = task.cosmetic_options
        chosen.update({k: v for k, v in sorted(self.task_options.items()) if k not in cosmetic})
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


_DICT_KEYS_OK = {"label_descriptions"}


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
    validate(spec)
    if spec.out is None:
        spec.out = str(Path("runs") / f"{spec.task}-{Path(spec.input).stem}")
    return spec


def _unknown_key_message(key: str, where: str, task: type[Task]) -> str:
    known = list(SHARED_KEYS) + list(task.options)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown option '{key}' in {where} for task '{task.name}'{hint}"


def validate(spec: JobSpec) -> None:
    from bulkrun.distributed.partition import parse_shard
    from bulkrun.job.values import parse_checkpoint, parse_size

    if spec.input is None:
        raise UsageError("no input file given")
    for name in ("window", "n", "max_tokens"):
        minimum = 0 if name == "max_tokens" else 1
        if getattr(spec, name) < minimum:
            raise UsageError(f"{name} must be >= {minimum}, got {getattr(spec, name)}")
    parse_checkpoint(spec.checkpoint_every)
    if spec.kv_cache_mem is not None:
        parse_size(spec.kv_cache_mem)
    if spec.shard is not None:
        parse_shard(spec.shard)
    if spec.kernels not in ("auto", "triton", "cpu", "reference"):
        raise UsageError(f"kernels must be auto, triton, cpu or reference, got {spec.kernels!r}")
    _check_kernels_fit_device(spec)
    if spec.prompt_template is not None:
        from bulkrun.tasks.base import template_fields

        try:
            template_fields(spec.prompt_template)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    spec.sampling()  # raises UsageError for invalid sampling values


def _check_kernels_fit_device(spec: JobSpec) -> None:
    """A forced kernel backend that cannot run on this run's device is a bad flag, found before any
    work (not a model-load failure at the first engine). Ray runs are left to their workers, whose
    devices the driver cannot see."""
    if spec.ray is not None or spec.kernels not in ("triton", "cpu"):
        return
    from bulkrun.engine.device import resolve_device

    try:
        on_cuda = resolve_device(spec.device).type == "cuda"
    except RuntimeError:
        raise UsageError(f"device must be cpu or cuda (cuda:N), got {spec.device!r}") from None
    if spec.kernels == "triton" and not on_cuda:
        raise UsageError(
            "--kernels triton needs a CUDA device and this run is on the CPU; use auto, cpu or reference"
        )
    if spec.kernels == "cpu" and on_cuda:
        raise UsageError(
            "--kernels cpu runs on the CPU and this run is on CUDA; use auto, triton or reference"
        )


def spec_from_file(path: Path, overrides: dict | None = None) -> JobSpec:
    """A spec file with command-line overrides on top (flags win over the file)."""
    return build_spec([(f"job spec '{path}'", load_toml(path)), ("the command line", overrides or {})])
