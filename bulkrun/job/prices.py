"""Provider batch prices from a TOML table, and what a job's tokens would cost at them.

    [[price]]
    provider = "openai"                  # any name; shown as given
    model = "gpt-4o-mini"
    input_usd_per_mtok = 0.075           # USD per million prompt tokens, at the batch price
    output_usd_per_mtok = 0.30           # USD per million generated tokens, at the batch price
    cached_input_usd_per_mtok = 0.0375   # optional: prompt tokens read from the provider's prompt cache
    as_of = 2026-12-01                   # the date of the figure (a TOML date): prices change
    note = "example figure"              # optional

One table per file, no network: the user keeps the figures current. Every problem is one line naming
the file, the entry and the key.
"""

from __future__ import annotations

import datetime
import difflib
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from bulkrun.exceptions import UsageError

MTOK = 1_000_000
_REQUIRED = ("provider", "model", "input_usd_per_mtok", "output_usd_per_mtok", "as_of")
_OPTIONAL = ("cached_input_usd_per_mtok", "note")


class PriceTableError(UsageError):
    """A price table that cannot be read or has a bad entry (a bad --prices file, exit 2)."""


@dataclass(frozen=True, slots=True)
class Price:
    provider: str
    model: str
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    as_of: datetime.date
    cached_input_usd_per_mtok: float | None = None
    note: str = ""

    def cost(self, prompt_tokens: int, generated_tokens: int, cached_prompt_tokens: int = 0) -> float:
        """USD for these tokens; cached prompt tokens are part of prompt_tokens, billed at the cached
        rate where the table gives one."""
        cached = min(cached_prompt_tokens, prompt_tokens) if self.cached_input_usd_per_mtok is not None else 0
        usd = (prompt_tokens - cached) * self.input_usd_per_mtok + generated_tokens * self.output_usd_per_mtok
        return (usd + cached * (self.cached_input_usd_per_mtok or 0.0)) / MTOK


@dataclass(frozen=True, slots=True)
class Cost:
    provider: str
    model: str
    as_of: datetime.date
    usd: float


def load_prices(path: str | Path) -> list[Price]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PriceTableError(
            f"cannot read the price table {path}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    return parse_prices(text, str(path))


def parse_prices(text: str, source: str = "<prices>") -> list[Price]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PriceTableError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(data) - {"price"}
    if unknown:
        raise PriceTableError(
            f"{source}: unknown top-level key {sorted(unknown)[0]!r} (entries are [[price]] tables)"
        )
    entries = data.get("price")
    if not isinstance(entries, list) or not entries:
        raise PriceTableError(f"{source}: no [[price]] entries")
    prices, seen = [], set()
    for number, entry in enumerate(entries, 1):
        price = _price(entry, f"{source}: [[price]] #{number}")
        key = (price.provider, price.model)
        if key in seen:
            raise PriceTableError(
                f"{source}: [[price]] #{number}: {price.provider}/{price.model} is listed twice"
            )
        seen.add(key)
        prices.append(price)
    return prices


def _price(entry: dict, where: str) -> Price:
    for key in entry:
        if key not in _REQUIRED + _OPTIONAL:
            close = difflib.get_close_matches(key, _REQUIRED + _OPTIONAL, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PriceTableError(f"{where}: unknown key {key!r}{hint}")
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise PriceTableError(f"{where}: missing {', '.join(missing)}")
    for key in ("provider", "model", "note"):
        if key in entry and not (isinstance(entry[key], str) and (entry[key] or key == "note")):
            raise PriceTableError(f"{where}: {key} must be a non-empty string")
    as_of = entry["as_of"]
    if not isinstance(as_of, datetime.date) or isinstance(as_of, datetime.datetime):
        raise PriceTableError(
            f"{where}: as_of must be a TOML date such as 2026-12-01 (unquoted), got {as_of!r}"
        )
    rates = {key: _rate(entry, key, where) for key in _REQUIRED + _OPTIONAL if key.endswith("_per_mtok")}
    return Price(entry["provider"], entry["model"], as_of=as_of, note=entry.get("note", ""), **rates)


def _rate(entry: dict, key: str, where: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise PriceTableError(f"{where}: {key} must be a number >= 0 (USD per million tokens), got {value!r}")
    return float(value)


def costs(
    prices: list[Price], prompt_tokens: int, generated_tokens: int, cached_prompt_tokens: int = 0
) -> list[Cost]:
    """The cost of the same tokens at every price in the table, cheapest first."""
    out = [
        Cost(p.provider, p.model, p.as_of, p.cost(prompt_tokens, generated_tokens, cached_prompt_tokens))
        for p in prices
    ]
    return sorted(out, key=lambda c: (c.usd, c.provider, c.model))
