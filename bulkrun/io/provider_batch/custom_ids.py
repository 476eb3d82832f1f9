"""custom_id <-> (row, id): the names a job's requests carry through a provider's batch and back.

Anthropic requires ^[a-zA-Z0-9_-]{1,64}$; OpenAI only asks for unique strings. One scheme serves both:
- the job's own id when it already fits the pattern (so provider dashboards show the user's ids),
- else `row-<row number>`; ids shaped like `row-<digits>` are never used as themselves, so the two
  forms cannot collide (job ids are unique, row numbers are unique);
- when the provider has no `n` (Anthropic) and the job wants several samples, each sample is its own
  request `<base>__s<k>`; then every custom_id carries the suffix and the last `__s` splits it.
The mapping is also recorded beside the batch files (custom_ids.jsonl), because a plain id alone does
not tell the import which row it was.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bulkrun.io.provider_batch.model import ProviderBatchError

MAX_CUSTOM_ID_LEN = 64  # Anthropic Message Batches: custom_id must match ^[a-zA-Z0-9_-]{1,64}$
CUSTOM_ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PLAIN = re.compile(r"^[a-zA-Z0-9_-]+$")
_RESERVED = re.compile(r"^row-\d+$")
SAMPLE_SEP = "__s"
MAP_FILE = "custom_ids.jsonl"


def sample_suffix_len(n: int) -> int:
    return len(f"{SAMPLE_SEP}{n - 1}")


def base_custom_id(item_id: str, row: int, reserve: int = 0) -> str:
    """The custom_id of a row; `reserve` characters are kept free for a sample suffix."""
    if _PLAIN.match(item_id) and len(item_id) <= MAX_CUSTOM_ID_LEN - reserve and not _RESERVED.match(item_id):
        return item_id
    return f"row-{row}"


def sample_custom_id(base: str, sample: int) -> str:
    return f"{base}{SAMPLE_SEP}{sample}"


class IdMap:
    """custom_id base -> (row, id), read back from the file the export wrote."""

    def __init__(self, entries: dict[str, tuple[int, str]], per_sample: bool, source: str = MAP_FILE):
        self.entries = entries
        self.per_sample = per_sample  # custom_ids carry a `__s<k>` sample suffix
        self.source = source

    @classmethod
    def load(cls, directory: Path, per_sample: bool) -> IdMap:
        path = Path(directory) / MAP_FILE
        entries: dict[str, tuple[int, str]] = {}
        try:
            with path.open(encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    try:
                        obj = json.loads(line)
                        entries[obj["custom_id"]] = (int(obj["row"]), str(obj["id"]))
                    except (ValueError, KeyError, TypeError) as exc:
                        raise ProviderBatchError(f"{path}:{lineno}: not an id-map line ({exc})") from None
        except OSError as exc:
            raise ProviderBatchError(f"cannot read the id map {path}: {exc.strerror or exc}") from None
        return cls(entries, per_sample, str(path))

    def resolve(self, custom_id: str) -> tuple[int, str, int] | None:
        """(row, id, sample) of a custom_id; None when this export never wrote it."""
        base, sample = custom_id, 0
        if self.per_sample:
            base, sep, k = custom_id.rpartition(SAMPLE_SEP)
            if not sep or not k.isdigit():
                return None
            sample = int(k)
        found = self.entries.get(base)
        return None if found is None else (found[0], found[1], sample)


def map_line(custom_id: str, row: int, item_id: str) -> str:
    return json.dumps({"custom_id": custom_id, "row": row, "id": item_id}, ensure_ascii=False) + "\n"
