"""The job's manifest: a fingerprint of what the committed shards are results of.

A rerun continues only if spec, model and input are all unchanged; otherwise it is refused (unless
--restart), because mixing results of two jobs in one directory would be silently wrong.

- spec: only the options that change results (task and its options, fields, template, sampling,
  --n, seed, context cap, dtype). Window size, checkpointing, progress, engine memory and batching
  knobs and the kernel choice do not change what a request produces, so they may change on resume.
- model: `model_fingerprint` of the resolved model directory (config, tokenizer, weight heads).
- input: size plus a SHA-256 of sampled bytes: the first and last MiB and 64 evenly spaced 64 KiB
  blocks in between. It costs the same for a 10 KB or a 100 GB file; it catches any append, truncation
  or rewrite, and most in-place edits (a same-size edit that touches no sampled block is missed).
  The path and mtime are not part of it: moving or copying the input does not void a job.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bulkrun.exceptions import JobChanged
from bulkrun.io.atomic import create_exclusive

MANIFEST = "manifest.json"
_HEAD = _TAIL = 1 << 20
_SAMPLES, _SAMPLE_BYTES = 64, 1 << 16


def input_fingerprint(path: Path) -> dict:
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(_HEAD))
        middle = size - _HEAD - _TAIL
        if middle > 0:
            for k in range(_SAMPLES):
                f.seek(_HEAD + middle * k // _SAMPLES)
                digest.update(f.read(_SAMPLE_BYTES))
        f.seek(max(0, size - _TAIL))
        digest.update(f.read(_TAIL))
    return {"size": size, "sample_sha256": digest.hexdigest()}


def spec_fingerprint(result_options: dict) -> str:
    blob = json.dumps(result_options, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_manifest(result_options: dict, model: dict, input_info: dict) -> dict:
    return {
        "bulkrun_manifest": 1,
        "spec": result_options,
        "spec_fingerprint": spec_fingerprint(result_options),
        "model": model,  # {"ref", "path", "fingerprint"}
        "input": input_info,  # {"path", "format", "size", "sample_sha256", "rows"}
    }


def job_fingerprint(manifest: dict) -> str:
    """One digest of spec, model and input: what slice markers and reports are tagged with."""
    parts = (
        manifest["spec_fingerprint"],
        manifest["model"]["fingerprint"],
        manifest["input"]["sample_sha256"],
    )
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def read_manifest(out: Path) -> dict | None:
    path = out / MANIFEST
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def write_or_check_manifest(out: Path, manifest: dict) -> dict:
    """Create the manifest, or check that the existing one describes the same job."""
    text = json.dumps(manifest, indent=2, default=str) + "\n"
    if create_exclusive(out / MANIFEST, text):
        return manifest
    old = read_manifest(out)
    change = describe_change(old, manifest)
    if change:
        raise JobChanged(
            f"output directory '{out}' holds a different job ({change}); "
            "rerun with --restart to discard it, or choose another --out"
        )
    return old


def _set(spec: dict) -> str:
    return json.dumps({k: v for k, v in spec.items() if v is not None}, sort_keys=True, default=str)


def describe_change(old: dict, new: dict) -> str | None:
    # An option added since the job began is absent from its manifest; unset (None) it means the
    # behaviour the job had, so it is no change: such a job directory keeps working.
    changed = old.get("spec_fingerprint") != new["spec_fingerprint"]
    if changed and _set(old.get("spec", {})) != _set(new["spec"]):
        keys = sorted(set(old.get("spec", {})) | set(new["spec"]))
        diffs = [k for k in keys if old.get("spec", {}).get(k) != new["spec"].get(k)]
        shown = ", ".join(f"{k}: {old.get('spec', {}).get(k)!r} -> {new['spec'].get(k)!r}" for k in diffs[:3])
        return f"spec changed: {shown or 'options differ'}"
    if old.get("model", {}).get("fingerprint") != new["model"]["fingerprint"]:
        return f"model changed: {old.get('model', {}).get('ref')!r} -> {new['model']['ref']!r}"
    old_in, new_in = old.get("input", {}), new["input"]
    if (old_in.get("size"), old_in.get("sample_sha256")) != (new_in["size"], new_in["sample_sha256"]):
        return f"input changed: '{new_in['path']}' is not the file this job started on"
    return None
