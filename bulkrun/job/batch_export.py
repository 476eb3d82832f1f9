"""`bulkrun batch prepare`: a job's rows as a provider's batch request files, ready to upload.

The rows go through the job's own input pipeline (job/pipeline.py, with the ids the job's manifest
records), so a row the job would turn into an error record (missing field, duplicate id, prompt too long
for the model, ...) is committed here as that error record in OUT, and every other row becomes one
request with the job's messages (template and system message applied; the provider applies its own
chat template), sampling options and structured-output constraint.

The export lives in OUT/batch/ beside the job's manifest: `bulkrun batch collect OUT FILE...` then
commits the provider's results as shards of this same job, and a plain local rerun of the job does
whatever the batch did not (rows the provider refused, expired requests). Rows already committed
in OUT are not exported again.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from bulkrun.exceptions import UsageError
from bulkrun.io.atomic import write_json_atomic
from bulkrun.io.formats import OPENAI
from bulkrun.io.manifest import job_fingerprint
from bulkrun.io.provider_batch import BatchError, BatchRequest, BatchSampling, ResponseFormat, write_batch
from bulkrun.io.provider_batch.model import UnsupportedOption
from bulkrun.io.shards import ERRORS_DIR, ShardWriter
from bulkrun.job.feed import Prepared, PromptBuilder
from bulkrun.job.resume import load_committed
from bulkrun.job.session import load_prompt_side, open_job
from bulkrun.job.spec import JobSpec

BATCH_DIR = "batch"  # OUT/batch/: the request files, custom_ids.jsonl, batch.json, job.json
JOB_FILE = "job.json"  # which job the export belongs to, and what import needs to shape its records
SCORING_TASKS = ("classify",)  # tasks that score continuations: a provider's batch only generates
COMMIT_EVERY = 1000


def export_batch(spec: JobSpec, provider: str, provider_model: str, *, overwrite: bool = False) -> dict:
    """Write OUT/batch/ for `provider` and commit the job's bad rows as error records in OUT."""
    if spec.task in SCORING_TASKS:
        raise UsageError(
            f"{spec.task} scores labels with the model's own probabilities, which a provider batch "
            "cannot return; run it locally"
        )
    sampling = job_sampling(spec)
    with open_job(spec) as session:
        side = load_prompt_side(spec, session.model_path)
        done = load_committed(session.out).done
        builder, feed = session.input(side, done=done, compile_constraints=False)
        openai_input = session.input_format == OPENAI
        errors = ShardWriter(session.out / ERRORS_DIR, f"part-export-{uuid.uuid4().hex[:8]}")
        counts = {"error_records": 0, "local_only": 0}
        refused: list[BatchError] = []

        def requests():
            for window in feed.windows():
                for record in window.errors:
                    errors.add(record)
                    counts["error_records"] += 1
                for prepared in window.prepared:
                    if any(r.continuations is not None for r in prepared.requests):
                        counts["local_only"] += 1  # a scored row: left for a local run
                        continue
                    yield _batch_request(builder, prepared, sampling if openai_input else None)
                if len(errors) >= COMMIT_EVERY:
                    errors.commit()

        directory = session.out / BATCH_DIR
        try:
            export = write_batch(
                requests(), provider, provider_model, sampling, directory,
                on_refused=refused.append, overwrite=overwrite,
            )  # fmt: skip
        finally:
            feed.close()
        errors.commit()  # the export is whole: its error records are the job's
        job = {
            "fingerprint": job_fingerprint(session.manifest),
            "keep_fields": list(spec.keep_fields),
            "openai_input": openai_input,
            # what import needs to check outputs and fill the `json` column as a local run does
            "json_schema": _job_schema(spec),
            "schema_field": spec.schema_field,
        }
        write_json_atomic(directory / JOB_FILE, job)
    return {
        "out": str(session.out),
        "directory": str(directory),
        "provider": provider,
        "requests": export.requests,
        "rows": export.rows - export.refused,
        "files": [f.name for f in export.files],
        "error_records": counts["error_records"],
        "refused": [e.record() for e in refused],
        "local_only": counts["local_only"],
    }


def read_job_file(directory: Path) -> dict | None:
    try:
        return json.loads((Path(directory) / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def job_sampling(spec: JobSpec) -> BatchSampling:
    """The job's sampling options and constraint as a provider request carries them."""
    spec.sampling()  # the job's own checks first (one clean line for a bad value)
    return BatchSampling(
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        min_p=spec.min_p,
        seed=spec.seed if spec.temperature > 0 else None,  # greedy output does not depend on a seed
        stop=tuple(spec.stop),
        n=spec.n,
        response_format=response_format(spec),
    )


def response_format(spec: JobSpec) -> ResponseFormat | None:
    """The job's structured-output constraint (json_schema / regex / choice), where a
    provider can enforce it. Providers take JSON schemas only; regex and choice have no equivalent
    whose output text would equal a local run's, so they are refused rather than approximated."""
    schema = _constraint(spec, "json_schema")
    for name in ("regex", "choice"):
        if _constraint(spec, name):
            raise UnsupportedOption(f"a provider batch cannot enforce --{name}; run this job locally")
    if not schema:
        return None
    if isinstance(schema, str):
        schema = _load_schema(schema)
    return ResponseFormat("json_schema", schema)


def _job_schema(spec: JobSpec) -> dict | None:
    fmt = response_format(spec)
    return None if fmt is None else fmt.schema


def _constraint(spec: JobSpec, name: str):
    value = getattr(spec, name, None)
    return value if value is not None else spec.task_options.get(name)


def _load_schema(text: str) -> dict:
    """A JSON schema given inline or as a file path."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(Path(text).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"--json-schema {text!r}: not a JSON schema or a readable schema file ({exc})"
        ) from None


def _batch_request(builder: PromptBuilder, prepared: Prepared, job: BatchSampling | None) -> BatchRequest:
    """One row's request; an OpenAI-batch input row carries its own sampling (its body's settings)."""
    item = prepared.item
    messages = builder.messages(builder.task.render(item))
    sampling = None
    if job is not None:
        params = prepared.requests[0].params
        body = item.fields.get("body") or {}
        sampling = BatchSampling(
            max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k, min_p=params.min_p, stop=tuple(params.stop), n=len(prepared.requests),
            seed=body.get("seed", job.seed), response_format=job.response_format,
        )  # fmt: skip
    return BatchRequest(item.index, item.id, messages, sampling)
