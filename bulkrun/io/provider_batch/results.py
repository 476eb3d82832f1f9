"""Read a provider's result files back into the job's terms: result records and error records.

read_results() streams every line of every file as SampleResult / BatchError, with the row and id
recorded at export; a line it cannot read or a custom_id the export never wrote stops the import with
an error naming the file, the line and the id (nothing is guessed). RowAssembler then joins the samples
of a row (Anthropic returns one line per sample, in any order, across files) into one record shaped like
a local run's (bulkrun.tasks.base.generation_columns).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from bulkrun.io.provider_batch import anthropic, openai
from bulkrun.io.provider_batch.custom_ids import IdMap
from bulkrun.io.provider_batch.model import BatchError, ParsedLine, ProviderBatchError, SampleResult
from bulkrun.io.provider_batch.writer import MANIFEST, BatchExport


def load_export(directory: Path) -> tuple[BatchExport, IdMap]:
    """What an export wrote (batch.json) and its custom_id map, for reading its results back."""
    try:
        export = BatchExport.load(directory)
    except (OSError, ValueError, TypeError) as exc:
        raise ProviderBatchError(
            f"{Path(directory) / MANIFEST}: not a readable batch export ({exc})"
        ) from None
    return export, IdMap.load(directory, export.per_sample)


def read_results(paths: Iterable[Path], id_map: IdMap, n: int = 1) -> Iterator[SampleResult | BatchError]:
    """Every outcome in the files (OpenAI output/error files and Anthropic results files alike)."""
    for path in paths:
        try:
            with Path(path).open(encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        yield from _outcomes(_parse(line, f"{path}:{lineno}"), id_map, n, f"{path}:{lineno}")
        except (OSError, UnicodeDecodeError) as exc:
            raise ProviderBatchError(f"cannot read the result file {path}: {exc}") from None


def _parse(line: str, where: str) -> ParsedLine:
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise TypeError("a result line must be a JSON object")
        return anthropic.parse(obj) if "result" in obj else openai.parse(obj)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ProviderBatchError(f"{where}: not a provider batch result line ({detail})") from None


def _outcomes(parsed: ParsedLine, id_map: IdMap, n: int, where: str) -> Iterator[SampleResult | BatchError]:
    found = id_map.resolve(parsed.custom_id)
    if found is None or found[2] >= n:
        raise ProviderBatchError(
            f"{where}: result for unknown custom_id {parsed.custom_id!r} (not written by this export: {id_map.source})"
        )
    row, item_id, first = found
    if parsed.error is not None:
        kind, message, retryable = parsed.error
        yield BatchError(row, item_id, kind, message, sample=first, retryable=retryable)
        return
    for index, text, reason, generated in parsed.choices:
        if first + index >= n:
            raise ProviderBatchError(
                f"{where}: choice {index} of {parsed.custom_id!r} but the export asked for n={n}"
            )
        yield SampleResult(row, item_id, first + index, text, reason, parsed.prompt_tokens, generated)


class RowAssembler:
    """Samples -> one record per row, once all `n` samples of the row are in.

    A row with a non-retryable error becomes that error record; a retryable error (expired, canceled,
    overloaded) leaves the row out, so the job's next run does it. Outcomes for a row already emitted
    (the same file imported twice, or listed twice) are counted as duplicates and dropped."""

    def __init__(self, n: int = 1, as_lists: bool = False):
        self.n, self.as_lists = n, as_lists
        self._partial: dict[int, dict[int, SampleResult]] = {}
        self._finished: set[int] = set()
        self.retryable: list[BatchError] = []
        self.duplicates = 0

    def add(self, outcome: SampleResult | BatchError) -> dict | BatchError | None:
        """The finished record or error of the outcome's row, or None while it is incomplete."""
        if outcome.row in self._finished:
            self.duplicates += 1
            return None
        if isinstance(outcome, BatchError):
            if outcome.retryable:
                self.retryable.append(outcome)
                return None
            self._finish(outcome.row)
            return outcome
        samples = self._partial.setdefault(outcome.row, {})
        if outcome.sample in samples:
            self.duplicates += 1
            return None
        samples[outcome.sample] = outcome
        if len(samples) < self.n:
            return None
        self._finish(outcome.row)
        return self._record([samples[k] for k in range(self.n)])

    def incomplete_rows(self) -> list[int]:
        """Rows with some samples in but not all (their other samples errored retryably or are missing)."""
        return sorted(self._partial)

    def _finish(self, row: int) -> None:
        self._partial.pop(row, None)
        self._finished.add(row)

    def _record(self, samples: list[SampleResult]) -> dict:
        first = samples[0]
        record = {"row": first.row, "id": first.id}
        columns = {
            "text": [s.text for s in samples],
            "finish_reason": [s.finish_reason for s in samples],
            "prompt_tokens": first.prompt_tokens,
            "generated_tokens": [s.generated_tokens for s in samples],
        }
        if self.n == 1 and not self.as_lists:
            columns = {k: v[0] if isinstance(v, list) else v for k, v in columns.items()}
        record.update(columns)
        return record
