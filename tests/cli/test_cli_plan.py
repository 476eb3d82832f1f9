"""`bulkrun plan` through the CLI: its counts are what the job then does (rows, bad rows by kind,
prompt tokens, requests), it writes nothing, and its options fail cleanly."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from helpers.models import ENGINE_FLAGS
from helpers.rows import read_jsonl, texts, write_jsonl

from bulkrun.exceptions import EXIT_ROW_ERRORS, EXIT_USAGE

BAD_ROWS = [
    {"id": "r2", "text": "a duplicate id"},
    {"id": "nofield"},
    {"id": "long", "text": "word " * 200},  # over --max-model-len
    {"id": "empty", "text": ""},
]


@pytest.fixture
def source(tmp_path):
    return write_jsonl(tmp_path / "in.jsonl", texts(9) + BAD_ROWS + texts(3, start=20))


def flags(cli_model, *more):
    return ["--model", cli_model, "--id-field", "id", "--max-tokens", "5", "--max-model-len", "256",
            "--quiet", *ENGINE_FLAGS, *more]  # fmt: skip


def plan_json(bulkrun, *args) -> dict:
    code, out, err = bulkrun("plan", *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("extra", [[], ["--n", "2", "--temperature", "0.8", "--system", "Be brief."]])
def test_plan_counts_what_the_job_then_does(bulkrun, tmp_path, source, cli_model, extra):
    plan = plan_json(bulkrun, source, *flags(cli_model, *extra), "--out", tmp_path / "out")
    assert not (tmp_path / "out").exists()  # plan writes nothing
    code, _, err = bulkrun("generate", source, *flags(cli_model, *extra), "--out", tmp_path / "out")
    assert code == EXIT_ROW_ERRORS, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    kinds = Counter(e["kind"] for e in read_jsonl(tmp_path / "out" / "errors.jsonl"))
    assert plan["rows"] == report["rows"] == 16
    assert plan["errors_by_kind"] == dict(kinds)
    assert set(kinds) == {"duplicate_id", "missing_field", "prompt_too_long", "empty_text"}
    assert plan["good_rows"] == report["results_total"]
    n = 2 if extra else 1
    assert plan["requests"] == n * report["results_total"]
    assert plan["prompt_tokens"] * n == report["prompt_tokens"]  # the job counts a row's prompt per sample
    assert 0 < plan["generated_tokens_estimate"] <= plan["generated_tokens_bound"] == plan["requests"] * 5
    assert plan["engine_tokens_per_s"] > 0 and plan["wall_seconds_estimate"] > 0
    assert plan["kv_bytes_available"] >= plan["kv_bytes_largest_request"] > 0


def test_no_sample_runs_nothing_and_leaves_the_estimates_out(bulkrun, source, cli_model):
    plan = plan_json(bulkrun, source, *flags(cli_model), "--no-sample")
    assert plan["generated_tokens_estimate"] is None and plan["wall_seconds_estimate"] is None
    assert plan["generated_tokens_bound"] == plan["requests"] * 5


def test_plan_takes_a_job_spec_and_prices(bulkrun, tmp_path, source, cli_model):
    spec = tmp_path / "job.toml"
    spec.write_text(f'task = "generate"\ninput = "{source}"\nid_field = "id"\nmax_tokens = 5\n')
    prices = tmp_path / "prices.toml"
    prices.write_text(
        '[[price]]\nprovider = "p"\nmodel = "m"\ninput_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n'
        "as_of = 2026-12-01\n"
    )
    args = [spec, "--model", cli_model, "--quiet", *ENGINE_FLAGS, "--no-sample", "--prices", prices]
    plan = plan_json(bulkrun, *args)
    assert plan["costs"] == [
        {
            "provider": "p",
            "model": "m",
            "as_of": "2026-12-01",
            "usd": None,
            "usd_bound": pytest.approx(
                (plan["prompt_tokens"] * 1.0 + plan["generated_tokens_bound"] * 2.0) / 1e6
            ),
        }
    ]
    code, out, _ = bulkrun("plan", *args)
    assert code == 0 and "p/m" in out and "rows" in out


def test_bad_options_stop_with_one_line(bulkrun, tmp_path, source, cli_model):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[price]]\nprovider = 1\n")
    code, _, err = bulkrun("plan", source, *flags(cli_model), "--prices", bad)
    assert code == EXIT_USAGE and "Traceback" not in err and str(bad) in err
    code, _, err = bulkrun("plan", source, *flags(cli_model), "--sample", "4", "--no-sample")
    assert code == EXIT_USAGE and "contradict" in err
