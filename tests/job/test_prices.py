"""Price tables: the TOML format, its errors, and the cost arithmetic."""

import datetime
from pathlib import Path

import pytest

from bulkrun.exceptions import EXIT_USAGE
from bulkrun.job.prices import Price, PriceTableError, costs, load_prices, parse_prices

EXAMPLE = Path(__file__).resolve().parents[2] / "jobs" / "prices" / "example.toml"
ENTRY = """
[[price]]
provider = "p"
model = "m"
input_usd_per_mtok = 1.0
output_usd_per_mtok = 4.0
as_of = 2026-12-01
"""


def test_the_shipped_example_loads_and_is_dated():
    prices = load_prices(EXAMPLE)
    assert {p.provider for p in prices} == {"openai", "anthropic"}
    assert all(isinstance(p.as_of, datetime.date) and "example" in p.note for p in prices)
    assert "EXAMPLE FIGURES" in EXAMPLE.read_text()


def test_cost_of_tokens():
    price = parse_prices(ENTRY)[0]
    assert price == Price("p", "m", 1.0, 4.0, datetime.date(2026, 12, 1))
    assert price.cost(2_000_000, 500_000) == pytest.approx(2.0 + 2.0)
    assert price.cost(2_000_000, 0, cached_prompt_tokens=1_000_000) == pytest.approx(2.0)  # no cached rate
    cached = parse_prices(ENTRY.replace("as_of", "cached_input_usd_per_mtok = 0.1\nas_of"))[0]
    assert cached.cost(2_000_000, 0, cached_prompt_tokens=1_000_000) == pytest.approx(1.0 + 0.1)
    assert cached.cost(1_000, 0, cached_prompt_tokens=5_000) == pytest.approx(0.1 * 1_000 / 1e6)


def test_costs_are_listed_cheapest_first():
    table = parse_prices(ENTRY + ENTRY.replace('"m"', '"cheap"').replace("4.0", "0.5"))
    assert [(c.model, round(c.usd, 6)) for c in costs(table, 1_000_000, 1_000_000)] == [
        ("cheap", 1.5),
        ("m", 5.0),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("price = [", "not valid TOML"),
        ("", "no \\[\\[price\\]\\] entries"),
        ("currency = 'EUR'\n" + ENTRY, "unknown top-level key 'currency'"),
        (
            ENTRY.replace("input_usd", "inptu_usd"),
            "unknown key 'inptu_usd_per_mtok' \\(did you mean 'input_usd",
        ),
        (ENTRY.replace('model = "m"\n', ""), "#1: missing model"),
        (ENTRY.replace("4.0", "-1"), "output_usd_per_mtok must be a number >= 0"),
        (ENTRY.replace("4.0", '"4"'), "output_usd_per_mtok must be a number"),
        (ENTRY.replace("2026-12-01", '"2026-12-01"'), "as_of must be a TOML date"),
        (ENTRY.replace('provider = "p"', "provider = 3"), "provider must be a non-empty string"),
        (ENTRY + ENTRY, "#2: p/m is listed twice"),
    ],
)
def test_bad_tables_are_one_clear_line(text, message):
    with pytest.raises(PriceTableError, match=message) as info:
        parse_prices(text, "prices.toml")
    assert str(info.value).startswith("prices.toml") and "\n" not in str(info.value)
    assert info.value.exit_code == EXIT_USAGE


def test_an_unreadable_file_names_it(tmp_path):
    with pytest.raises(PriceTableError, match="cannot read the price table .*absent.toml"):
        load_prices(tmp_path / "absent.toml")
