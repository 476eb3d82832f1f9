"""Everything checked before any work: task, input, model, output directory, engine.

Each failure is a BulkrunError with one clear line (usage, input, model, lock, changed job).
"""

from __future__ import annotations

from pathlib import Path

from bulkrun.errors import ModelError, OutputError, UsageError
from bulkrun.io.formats import detect_format
from bulkrun.job.registry import task_class
from bulkrun.job.spec import JobSpec
from bulkrun.job.values import parse_size
from bulkrun.tasks.base import Task, TaskContext


def build_task(spec: JobSpec) -> Task:
    cls = task_class(spec.task)
    try:
        return cls.from_options(dict(spec.task_options))
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{spec.task}: {exc}") from None


def out_dir(spec: JobSpec) -> Path:
    if spec.out and "://" in spec.out:
        raise UsageError(f"--out {spec.out}: the job layer writes to local or shared (NFS) paths, not URIs")
    if spec.out:
        out = Path(spec.out)
    else:
        out = Path("runs") / f"{spec.task}-{Path(spec.input).stem}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create output directory '{out}': {exc.strerror or exc}") from None
    if not out.is_dir():
        raise OutputError(f"output '{out}' is not a directory")
    return out


def input_format(spec: JobSpec) -> tuple[Path, str]:
    path = Path(spec.input)
    return path, detect_format(path)


def resolve_model(spec: JobSpec) -> tuple[Path, dict]:
    from bulkrun.model_source import ModelNotFound, model_fingerprint
    from bulkrun.model_source import resolve_model as resolve

    try:
        path = resolve(spec.model)
    except ModelNotFound as exc:
        raise ModelError(str(exc)) from None
    return path, {"ref": spec.model or "default", "path": str(path), "fingerprint": model_fingerprint(path)}


def engine_config(spec: JobSpec):
    from bulkrun.engine.config import EngineConfig

    values = {
        "kv_cache_bytes": parse_size(spec.kv_cache_mem) if spec.kv_cache_mem else None,
        "max_num_seqs": spec.max_seqs,
        "max_num_batched_tokens": spec.max_batch_tokens,
        "enable_prefix_caching": spec.prefix_cache,
        "dtype": spec.dtype,
        "device": spec.device,
        "kernels": spec.kernels,
        "max_model_len": spec.max_model_len,
    }
    try:
        return EngineConfig(**{k: v for k, v in values.items() if v is not None})
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def load_engine(spec: JobSpec, model_path: Path):
    from bulkrun.engine.engine import Engine

    config = engine_config(spec)
    try:
        return Engine.from_model(str(model_path), config)
    except (ValueError, OSError, NotImplementedError) as exc:
        raise ModelError(f"cannot load model '{model_path}': {exc}") from None


def task_context(spec: JobSpec, engine) -> TaskContext:
    tokenizer = engine.tokenizer
    if spec.chat_template and not getattr(tokenizer, "chat_template", None):
        raise UsageError("the model has no chat template; pass --no-chat-template to use plain prompts")
    return TaskContext(
        tokenizer=tokenizer,
        max_model_len=engine.max_model_len,
        sampling=spec.sampling(),
        n=spec.n,
        text_field=spec.text_field,
        prompt_template=spec.prompt_template,
    )
