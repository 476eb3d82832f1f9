"""Write a job's requests as one provider's batch files, split at that provider's documented limits.

DIR/<provider>-NNNNN.jsonl  request lines, each file within the provider's request and byte limits
DIR/custom_ids.jsonl        custom_id -> row and id (the import reads it back)
DIR/batch.json              what was written: provider, model, files, counts, sample mode

Every file is written to a temporary name and renamed when complete, so a file that exists is whole.
Requests stream through: memory does not grow with the number of rows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bulkrun.io.atomic import TMP_PREFIX, fsync_dir, write_json_atomic
from bulkrun.io.provider_batch import anthropic, openai
from bulkrun.io.provider_batch.custom_ids import (
    MAP_FILE,
    base_custom_id,
    map_line,
    sample_custom_id,
    sample_suffix_len,
)
from bulkrun.io.provider_batch.model import (
    BatchError,
    BatchRequest,
    BatchSampling,
    ExportExists,
    RowRefused,
    UnsupportedOption,
)

PROVIDERS = {openai.NAME: openai, anthropic.NAME: anthropic}
MANIFEST = "batch.json"


@dataclass
class BatchFile:
    name: str
    requests: int
    bytes: int  # as the provider counts it (Anthropic: the wrapping {"requests": [...]} included)


@dataclass
class BatchExport:
    provider: str
    model: str
    n: int
    per_sample: bool  # one request per sample (custom_ids carry `__s<k>`)
    rows: int = 0
    requests: int = 0
    refused: int = 0
    files: list[BatchFile] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path) -> BatchExport:
        data = json.loads((Path(directory) / MANIFEST).read_text(encoding="utf-8"))
        files = [BatchFile(**f) for f in data.pop("files")]
        return cls(**data, files=files)


class SplitWriter:
    """JSONL lines into numbered files, starting a new file before a limit would be passed."""

    def __init__(self, directory: Path, stem: str, max_requests: int, max_bytes: int, overhead: int = 0):
        self.directory, self.stem = directory, stem
        self.max_requests, self.max_bytes, self.overhead = max_requests, max_bytes, overhead
        self.files: list[BatchFile] = []
        self._handle = None

    def add(self, line: bytes) -> None:
        current = self.files[-1] if self._handle else None
        # the newline counts as the comma between entries where the provider wraps the lines
        if (
            current is None
            or current.requests >= self.max_requests
            or (current.bytes + len(line) + 1 > self.max_bytes)
        ):
            self._finish()
            self._start()
            current = self.files[-1]
        self._handle.write(line + b"\n")
        current.requests += 1
        current.bytes += len(line) + (1 if current.requests > 1 else 0)

    def close(self) -> list[BatchFile]:
        self._finish()
        return self.files

    def _start(self) -> None:
        name = f"{self.stem}-{len(self.files) + 1:05d}.jsonl"
        self.files.append(BatchFile(name, 0, self.overhead))
        self._handle = (self.directory / (TMP_PREFIX + name)).open("wb")

    def abort(self) -> None:
        """Remove everything this writer wrote: without its manifest an export is not one."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            (self.directory / (TMP_PREFIX + self.files[-1].name)).unlink(missing_ok=True)
        for f in self.files:
            (self.directory / f.name).unlink(missing_ok=True)

    def _finish(self) -> None:
        if self._handle is None:
            return
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        self._handle = None
        name = self.files[-1].name
        os.replace(self.directory / (TMP_PREFIX + name), self.directory / name)
        fsync_dir(self.directory)


def write_batch(
    requests: Iterable[BatchRequest],
    provider: str,
    model: str,
    sampling: BatchSampling,
    directory: Path,
    on_refused: Callable[[BatchError], None] = lambda error: None,
    overwrite: bool = False,
) -> BatchExport:
    """Write the requests as `provider` batch files under `directory`; rows the provider's format cannot
    express go to `on_refused` as error records. An option the provider cannot honour raises
    UnsupportedOption, and an earlier export in `directory` raises ExportExists (unless `overwrite`),
    before anything is written. batch.json is written last: an export without it is incomplete."""
    fmt = PROVIDERS.get(provider)
    if fmt is None:
        raise UnsupportedOption(f"unknown provider {provider!r} (choose from {', '.join(PROVIDERS)})")
    fmt.check_sampling(sampling)
    directory = Path(directory)
    _clear_earlier_export(directory, overwrite)
    directory.mkdir(parents=True, exist_ok=True)
    export = BatchExport(provider, model, sampling.n, per_sample=not fmt.NATIVE_N and sampling.n > 1)
    splitter = SplitWriter(directory, provider, fmt.MAX_REQUESTS, fmt.MAX_BYTES, fmt.FILE_OVERHEAD_BYTES)
    map_tmp = directory / (TMP_PREFIX + MAP_FILE)
    try:
        with map_tmp.open("w", encoding="utf-8") as id_map:
            for req in requests:
                export.rows += 1
                lines = _request_lines(fmt, req, model, sampling, export)
                if isinstance(lines, BatchError):
                    export.refused += 1
                    on_refused(lines)
                    continue
                id_map.write(map_line(lines[0][0], req.row, req.id))
                for _, line in lines:
                    splitter.add(line)
                    export.requests += 1
        export.files = splitter.close()
        os.replace(map_tmp, directory / MAP_FILE)
    except BaseException:
        splitter.abort()
        map_tmp.unlink(missing_ok=True)
        raise
    write_json_atomic(directory / MANIFEST, asdict(export))
    return export


def _earlier_export(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    names = [MANIFEST, MAP_FILE]
    found = [directory / name for name in names if (directory / name).exists()]
    return found + sorted(
        p for name in PROVIDERS for p in directory.glob(f"{name}-[0-9][0-9][0-9][0-9][0-9].jsonl")
    )


def _clear_earlier_export(directory: Path, overwrite: bool) -> None:
    """An earlier export's files would mix with this one's (a stale part file, another id map)."""
    earlier = _earlier_export(directory)
    if earlier and not overwrite:
        raise ExportExists(
            f"{directory} already holds a batch export ({earlier[0].name}); choose another "
            "directory or overwrite it"
        )
    for path in earlier:
        path.unlink()


def _request_lines(fmt, req: BatchRequest, model: str, sampling: BatchSampling, export: BatchExport):
    """[(base custom_id, line bytes)] of one row, or the BatchError that refuses it."""
    params = req.sampling or sampling
    if params.n != sampling.n:
        # the custom_id scheme (and the import's sample count) is fixed for the whole export
        return BatchError(
            req.row, req.id, "invalid_request", f"n={params.n} differs from the export's n={sampling.n}"
        )
    try:
        if req.sampling is not None:
            fmt.check_sampling(params)
        if export.per_sample:
            base = base_custom_id(req.id, req.row, reserve=sample_suffix_len(params.n))
            single = replace(params, n=1)
            objs = [
                fmt.request(sample_custom_id(base, k), model, req.messages, single) for k in range(params.n)
            ]
        else:
            base = base_custom_id(req.id, req.row)
            objs = [fmt.request(base, model, req.messages, params)]
    except (RowRefused, UnsupportedOption) as exc:
        kind = getattr(exc, "kind", "unsupported_option")
        return BatchError(req.row, req.id, kind, getattr(exc, "message", str(exc)))
    lines = [(base, json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()) for obj in objs]
    for _, line in lines:
        if not _fits(fmt, line):
            message = f"{len(line)} bytes as a {fmt.NAME} request: over the {fmt.MAX_BYTES}-byte file limit"
            return BatchError(req.row, req.id, "request_too_large", message)
    return lines


def _fits(fmt, line: bytes) -> bool:
    return fmt.FILE_OVERHEAD_BYTES + len(line) <= fmt.MAX_BYTES
