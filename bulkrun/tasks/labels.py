"""Label sets for classification: parsed from a comma list, a file or a job spec, and validated.

A label set needs at least two distinct labels: with one label every item would get probability 1
and the job would silently say nothing. Duplicates (compared without case or surrounding space) are
refused because two identical continuations would split the probability mass between them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


class LabelError(ValueError):
    """A label list the classifier cannot use; the message says why."""


@dataclass(frozen=True)
class LabelSet:
    names: tuple[str, ...]
    descriptions: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self.names)
        unknown = [name for name in self.descriptions if name not in self.names]
        if unknown:
            raise LabelError(f"descriptions given for unknown labels: {', '.join(unknown)}")

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self):
        return iter(self.names)

    def description(self, name: str) -> str | None:
        return self.descriptions.get(name)

    def find(self, value: str) -> str | None:
        """The label matching `value` ignoring case and surrounding space, or None."""
        key = value.strip().casefold()
        for name in self.names:
            if name.casefold() == key:
                return name
        return None


def _validate(names: tuple[str, ...]) -> None:
    for name in names:
        if not isinstance(name, str):
            raise LabelError(f"a label must be a string, got {name!r}")
        if not name.strip():
            raise LabelError("empty label in the label list")
        if name != name.strip():
            raise LabelError(f"label {name!r} has surrounding whitespace")
        if "\n" in name or "\r" in name:
            raise LabelError(f"label {name!r} contains a line break")
    if len(names) < 2:
        given = f"only {names[0]!r}" if names else "none"
        raise LabelError(f"classification needs at least two labels, got {given}")
    seen: dict[str, str] = {}
    for name in names:
        key = name.casefold()
        if key in seen:
            first = seen[key]
            also = "" if first == name else f" (also given as {first!r})"
            raise LabelError(f"duplicate label {name!r}{also}")
        seen[key] = name


def parse_label_list(text: str) -> LabelSet:
    """`billing,bug,feature` -> LabelSet. Surrounding spaces around each label are dropped."""
    names = tuple(part.strip() for part in text.split(","))
    if any(not name for name in names) and text.strip():
        raise LabelError(f"empty label in the list {text!r} (two commas in a row or a trailing comma?)")
    return LabelSet(tuple(n for n in names if n))


def parse_label_lines(lines: Iterable[str], source: str = "label file") -> LabelSet:
    """One label per line, optionally `label: description`; blank lines and `#` comments skipped."""
    names: list[str] = []
    descriptions: dict[str, str] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, description = line.partition(":")
        name = name.strip()
        if not name:
            raise LabelError(f"{source} line {number}: no label before ':'")
        names.append(name)
        if sep and description.strip():
            descriptions[name] = description.strip()
    return LabelSet(tuple(names), descriptions)


def load_label_file(path: str | Path) -> LabelSet:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LabelError(f"cannot read label file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise LabelError(f"label file {path} is not UTF-8") from exc
    return parse_label_lines(text.splitlines(), source=str(path))


def labels_from_cli(value: str) -> LabelSet:
    """`--labels`: an existing file path (or `@path`) is read as a label file, else a comma list."""
    if value.startswith("@"):
        return load_label_file(value[1:])
    if "," not in value and Path(value).is_file():
        return load_label_file(value)
    return parse_label_list(value)


def labels_from_spec(labels, descriptions: Mapping[str, str] | None = None) -> LabelSet:
    """Job-spec form: a list of names, or of `{name, description}` tables, or a comma string;
    `descriptions` (label -> text) is merged in and wins over inline ones."""
    if isinstance(labels, str):
        base = parse_label_list(labels)
    elif isinstance(labels, (list, tuple)):
        base = _from_entries(labels)
    else:
        raise LabelError(f"labels must be a list or a comma-separated string, got {type(labels).__name__}")
    merged = dict(base.descriptions)
    for name, text in (descriptions or {}).items():
        if not isinstance(text, str):
            raise LabelError(f"description of {name!r} must be a string")
        merged[str(name)] = text.strip()
    return LabelSet(base.names, merged)


def _from_entries(entries) -> LabelSet:
    names: list[str] = []
    descriptions: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, Mapping):
            name = entry.get("name") or entry.get("label")
            if not isinstance(name, str):
                raise LabelError(f"label entry {dict(entry)!r} needs a string 'name'")
            names.append(name.strip())
            if entry.get("description"):
                descriptions[name.strip()] = str(entry["description"]).strip()
        elif isinstance(entry, str):
            names.append(entry.strip())
        else:
            raise LabelError(f"a label must be a string, got {entry!r}")
    return LabelSet(tuple(names), descriptions)


def label_set_from_options(options: Mapping) -> LabelSet:
    """The labels of a job: `labels` (a CLI string: comma list or file path; or a spec list),
    or `labels_file`, with `label_descriptions` merged in."""
    labels, labels_file = options.get("labels"), options.get("labels_file")
    if labels is not None and labels_file is not None:
        raise LabelError("give either labels or labels_file, not both")
    if labels_file is not None:
        base = load_label_file(labels_file)
    elif isinstance(labels, str):
        base = labels_from_cli(labels)
    elif labels is not None:
        base = labels_from_spec(labels)
    else:
        raise LabelError("no labels given: use --labels billing,bug,... or a labels file")
    return labels_from_spec(list(_entries(base)), options.get("label_descriptions"))


def _entries(labels: LabelSet):
    for name in labels:
        description = labels.description(name)
        yield {"name": name, "description": description} if description else name
